#!/usr/bin/env bash
# Starts virtlogd and libvirtd for the libvirt driver's tests when they are
# not running (no systemd needed). Idempotent; prints what it started.
set -euo pipefail
sock=/run/libvirt/libvirt-sock

# On hosts without udev /dev/kvm is root:root 0600: libvirt's QEMU user
# cannot open it, and libvirt 9.0 then re-probes QEMU on every API call
# (seconds each). Give it what Debian's udev rules give it, as
# `vmfork libvirt setup` does, and say so.
if [ -e /dev/kvm ] && getent group kvm >/dev/null; then
  before=$(stat -c '%U:%G %a' /dev/kvm)
  if [ "$(stat -c '%G' /dev/kvm)" != kvm ] || [ $(( 0$(stat -c '%a' /dev/kvm) & 060 )) -ne $(( 060 )) ]; then
    chgrp kvm /dev/kvm
    chmod g+rw /dev/kvm
    echo "gave /dev/kvm group kvm and mode $(stat -c '%a' /dev/kvm), as udev does (was $before)" >&2
  fi
fi
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
