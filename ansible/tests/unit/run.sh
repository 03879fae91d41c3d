#!/bin/sh
# Runs the collection's unit tests with unittest's discovery (no network, no
# VM): the collection is linked as ansible_collections/vmfork/vmfork in a
# temp dir, as Ansible finds it. Uses Debian's python3 with ansible-core.
set -eu
coll=$(cd "$(dirname "$0")/../.." && pwd)
py=${PYTHON:-/usr/bin/python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/ansible_collections/vmfork"
ln -s "$coll" "$tmp/ansible_collections/vmfork/vmfork"
cd "$tmp"
# Ansible's collection loader goes in before anything under ansible_collections
# is imported (importing ansible.plugins.loader installs it for
# ANSIBLE_COLLECTIONS_PATH), as ansible-test's pytest plugin does; then this
# is python3 -m unittest discover.
ANSIBLE_COLLECTIONS_PATH="$tmp" PYTHONDONTWRITEBYTECODE=1 "$py" -c '
import sys, unittest
import ansible.plugins.loader
unittest.main(module=None, argv=["python3 -m unittest", "discover", "-s", sys.argv[2], "-t", sys.argv[1]] + sys.argv[3:])
' "$tmp" ansible_collections/vmfork/vmfork/tests/unit "$@"
