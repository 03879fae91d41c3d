#!/usr/bin/env bash
# Installs what vmfork's build, demo and tests need on Debian 12, through
# apt-get. Idempotent: when everything is present it only checks, in well
# under a second. Needs root (or sudo) only when something is missing.
set -euo pipefail

pkgs=(
  qemu-system-x86 qemu-utils qemu-guest-agent busybox-static
  libvirt-dev libvirt-daemon-system
  cpio e2fsprogs gzip
  debootstrap dnsmasq-base iproute2 iputils-ping openssh-client
  # template push/pull tests: an sshd per simulated host (tests/hosts_test.go)
  openssh-server
  # the nft CLI: egress tests read back the tables vmfork makes (the product
  # itself speaks netlink, never runs nft)
  nftables
  ansible-core python3 zstd
  # vmfork mcp's independent test client (tests/mcp-client) and the Python package (python/)
  nodejs python3-pip python3-setuptools
  # ansible-test sanity and units with Debian's checkers (scripts/ansible-test.py)
  pylint pycodestyle yamllint shellcheck python3-voluptuous python3-mock
  python3-pytest python3-pytest-xdist python3-pytest-forked python3-pytest-mock
)
# The guest kernel: Debian's generic flavour (it has CONFIG_VMGENID; the cloud
# flavour does not). tests/guest/build.sh downloads it with apt-get download,
# so only the package lists are needed here.

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
# npm for tests/mcp-client: Debian packages it apart from nodejs (a nodejs
# from NodeSource carries its own, and conflicts with Debian's npm).
if ! command -v npm >/dev/null 2>&1; then
  missing+=(npm)
fi

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "vmfork deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq >&2
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
