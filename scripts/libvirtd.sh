#!/usr/bin/env bash
# Starts virtlogd and libvirtd for the libvirt driver's tests when they are
# not running (no systemd needed). Idempotent; prints what it started.
set -euo pipefail
sock=/run/libvirt/libvirt-sock
if ! pgrep -x virtlogd >/dev/null; then
  virtlogd -d
  echo "started virtlogd" >&2
fi
if ! pgrep -x libvirtd >/dev/null; then
  libvirtd -d
  echo "started libvirtd" >&2
fi
for _ in $(seq 100); do
  if [ -S "$sock" ] && virsh -c qemu:///system version >/dev/null 2>&1; then
    exit 0
  fi
  sleep 0.1
done
echo "libvirtd did not answer on $sock" >&2
exit 1
