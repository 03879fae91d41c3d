#!/bin/sh
# Runs `ansible-test sanity` and `ansible-test units` (Debian 12's
# ansible-core 2.14) on the collection in ansible/, with Debian's checkers
# (scripts/ansible-test.py says why). ansible-test wants the collection at
# ansible_collections/vmfork/vmfork and not behind a symlink, so a copy goes
# into a temp dir, removed afterwards. No network, no VM.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
coll="$tmp/ansible_collections/vmfork/vmfork"
mkdir -p "$(dirname "$coll")"
cp -a "$root/ansible" "$coll"
rm -rf "$coll/tests/output"
cd "$coll"
# Debian's python3, where Debian's checkers are (not a pyenv or venv python
# that may come first in PATH).
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
run() { /usr/bin/python3 "$root/scripts/ansible-test.py" "$@" --python 3.11 --color no; }
run sanity
run units --requirements-mode skip
