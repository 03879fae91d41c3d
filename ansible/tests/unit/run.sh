#!/bin/sh
# Runs the collection's unit tests with python3 -m unittest (no network, no
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
PYTHONDONTWRITEBYTECODE=1 "$py" -m unittest discover -s ansible_collections/vmfork/vmfork/tests/unit -t . "$@"
