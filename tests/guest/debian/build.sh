#!/usr/bin/env bash
# Builds the real-distribution test guest: a stock Debian 12 system made with debootstrap from
# Debian's packages only, with nothing of vmfork inside (users' guests have nothing of ours).
#
# Usage: tests/guest/debian/build.sh [OUTDIR]    (default: /var/cache/vmfork/debian-guest)
#
# Outputs in OUTDIR/<build id>/: vmlinuz, initrd.img (the image's own initramfs-tools initrd),
# root.qcow2 (ext4, booted as root=/dev/vda and never written: vmfork puts an overlay on it),
# kernel-release, variants ("NAME<TAB>kernel command line" per line), stamp. OUTDIR/current
# links to the newest build. A build's files never change once made, because overlays and
# frozen templates name their backing file by path: a rebuild makes a new directory, so
# machines of the old one keep a consistent chain. (So there are no OUTDIR/root.qcow2 links:
# a path that a rebuild redirects is what must not be given to vmfork.)
# The newest two builds are kept. The default OUTDIR lies outside the checkout so that fresh
# clones on this machine reuse it.
# A second run is a no-op while the stamp matches the inputs: this directory's files and the
# host's apt lists for Debian 12 (what apt-get update last fetched). Downloaded .debs are kept
# in VMFORK_DEBIAN_DEBS (default /var/cache/vmfork/debs) for the next build.
# Progress goes to stderr; stdout carries only the absolute path of the build's directory
# (OUTDIR/<build id>, current resolved). Needs root.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec 3>&1 1>&2 # everything but the final path goes to stderr

log() { printf 'debian-guest: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

mirror=http://deb.debian.org/debian
security=http://deb.debian.org/debian-security
suite=bookworm
# What a minimal Debian server with an agent has; python3 beside python3-minimal because
# Ansible's modules import json, which python3-minimal lacks. Recommends are left out, as on a minbase
# install; dbus is installed and masked at boot for the variant without it. curl and
# ca-certificates: what a server that calls HTTPS APIs has, and what the brokered-secrets test
# drives (the contract installs vmfork's CA with update-ca-certificates).
packages=(
	systemd-sysv udev dbus linux-image-amd64 initramfs-tools
	openssh-server qemu-guest-agent python3-minimal python3
	iproute2 procps ifupdown isc-dhcp-client iputils-ping
	curl ca-certificates
)
outputs=(vmlinuz initrd.img root.qcow2 kernel-release variants)

# The variants are systemd's own kernel command line switches over one stock image.
base_append="console=ttyS0 root=/dev/vda rw net.ifnames=0 quiet panic=-1"
mask_networkd="systemd.mask=systemd-networkd.service systemd.mask=systemd-networkd.socket systemd.mask=systemd-networkd-wait-online.service"
mask_ifupdown="systemd.mask=networking.service"
mask_dbus="systemd.mask=dbus.service systemd.mask=dbus.socket"
variants() {
	printf '%s\t%s\n' \
		ifupdown-dbus "$base_append $mask_networkd" \
		ifupdown-nodbus "$base_append $mask_networkd $mask_dbus" \
		networkd-dbus "$base_append $mask_ifupdown" \
		networkd-nodbus "$base_append $mask_ifupdown $mask_dbus"
}

[[ $(id -u) -eq 0 ]] || die "must run as root (debootstrap, chroot, file ownership in the image)"
for tool in debootstrap chroot mke2fs qemu-img sha256sum flock find sort; do
	command -v "$tool" >/dev/null || die "$tool not found (Debian packages: debootstrap, coreutils, e2fsprogs, qemu-utils, util-linux, findutils)"
done

outdir=${1:-/var/cache/vmfork/debian-guest}
debs=${VMFORK_DEBIAN_DEBS:-/var/cache/vmfork/debs}
mkdir -p "$outdir" "$debs"
outdir=$(cd "$outdir" && pwd)
debs=$(cd "$debs" && pwd)

# Concurrent callers wait here; the loser then finds a matching stamp. The .deb cache is
# shared by every OUTDIR, so it has a lock of its own.
exec 9>"$outdir/.lock"
flock 9

lists=/var/lib/apt/lists
host_lists() { # the host's Debian 12 lists, the ones the image is installed from
	find "$lists" -maxdepth 1 -type f -name 'deb.debian.org_debian*_dists_bookworm*' | LC_ALL=C sort
}
if ! host_lists | grep -q "_dists_${suite}-security_main_binary-amd64_Packages"; then
	log "no bookworm lists in $lists; running apt-get update"
	apt-get -q update || die "apt-get update failed"
	host_lists | grep -q "_dists_${suite}_main_binary-amd64_Packages" || die "apt-get update fetched no $suite lists from deb.debian.org (see /etc/apt/sources.list.d)"
fi

inputs_hash() {
	(
		cd "$here"
		find . -type f ! -name README.md -printf '%p %m\n' | LC_ALL=C sort
		find . -type f ! -name README.md -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
		host_lists | grep '_InRelease$' | xargs sha256sum
	) | sha256sum | cut -d' ' -f1
}
header=$(
	printf 'vmfork-debian-guest\n'
	printf 'inputs %s\n' "$(inputs_hash)"
)

# A build's id is the inputs' hash: the same inputs name the same directory.
id=$(sha256sum <<<"$header" | cut -c1-12)
build=$outdir/$id

up_to_date() {
	[[ -f $build/stamp ]] || return 1
	[[ $(grep -Ev '^(output|package|size) ' "$build/stamp") == "$header" ]] || return 1
	[[ $(grep -c '^output ' "$build/stamp") -eq ${#outputs[@]} ]] || return 1
	# Sizes only: hashing 200 MB on every test run costs seconds; the files are never rewritten.
	(cd "$build" && grep '^size ' stamp | while read -r _ size f; do
		[[ $(stat -c %s "$f" 2>/dev/null) == "$size" ]] || exit 1
	done)
}

# use_build makes $build the current one (and the newest, for pruning).
use_build() {
	touch "$build"
	if [[ $(readlink "$outdir/current" 2>/dev/null) != "$id" ]]; then
		ln -sfn "$id" "$outdir/current.tmp"
		mv -T "$outdir/current.tmp" "$outdir/current"
	fi
}

if up_to_date; then
	use_build
	log "up to date: $build ($(cat "$build/kernel-release"))"
	printf '%s\n' "$build" >&3
	exit 0
fi

exec 8>"$debs/.lock"
flock 8

started=$SECONDS
log "building $build"
tmp=$(mktemp -d "$outdir/.build.XXXXXX")
root=$tmp/root
out=$tmp/out
mkdir -p "$root" "$out"

# unmount_all unmounts everything below the build dir, deepest first; rm -rf must never
# descend into a mounted /proc or /sys of the chroot.
unmount_all() {
	local m
	while read -r m; do
		umount "$m" 2>/dev/null || umount -l "$m"
	done < <(awk -v p="$root/" 'index($2, p) == 1 { print $2 }' /proc/mounts | LC_ALL=C sort -r)
}
cleanup() {
	unmount_all
	# The .deb cache was moved into the chroot for apt; move it back before removing the rest.
	if [[ -d $root/var/cache/apt/archives ]]; then
		find "$root/var/cache/apt/archives" -maxdepth 1 -name '*.deb' -exec mv -f -t "$debs" {} + 2>/dev/null || true
	fi
	if awk -v p="$root/" 'index($2, p) == 1 { found = 1 } END { exit !found }' /proc/mounts; then
		log "warning: mounts left below $root; not removing it"
		return
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT

# debootstrap runs from a local mirror made of the host's own apt data: the InRelease that apt
# fetched (signed by Debian, checked by debootstrap against its keyring), the Packages file it
# lists (the host's list, decompressed: its SHA256 is in that InRelease) and the .debs from the
# cache (checked by debootstrap against Packages). Missing .debs are fetched with apt-get
# download; with a full cache the build needs no network at all.
local_mirror=$tmp/mirror
pkgs=$local_mirror/dists/$suite/main/binary-amd64/Packages
mkdir -p "${pkgs%/*}"
cp "$lists/deb.debian.org_debian_dists_${suite}_InRelease" "$local_mirror/dists/$suite/InRelease"
packages_list=$(host_lists | grep "_dists_${suite}_main_binary-amd64_Packages" | head -n1)
/usr/lib/apt/apt-helper cat-file "$packages_list" >"$pkgs"
base=$(debootstrap --variant=minbase --print-debs "$suite" "$tmp/probe" "file://$local_mirror") ||
	die "debootstrap --print-debs $suite from the host's lists failed"
rm -rf "$tmp/probe"
# link_debs links each cached .deb of the base system into the mirror's pool and lists the
# missing ones in $missing.
link_debs() {
	local pkg ver arch file cached
	missing=()
	while read -r pkg ver arch file; do
		cached=$debs/${pkg}_${ver//:/%3a}_$arch.deb
		[[ -f $cached ]] || cached=$debs/${file##*/}
		if [[ ! -f $cached ]]; then
			missing+=("$pkg=$ver")
			continue
		fi
		mkdir -p "$local_mirror/${file%/*}"
		ln -sfn "$cached" "$local_mirror/$file"
	done < <(awk -v want="$base" '
		BEGIN { n = split(want, w, " "); for (i = 1; i <= n; i++) need[w[i]] = 1 }
		/^Package: / { p = $2 } /^Version: / { v = $2 } /^Architecture: / { a = $2 } /^Filename: / { f = $2 }
		/^$/ { if (p in need) print p, v, a, f; p = "" }
		END { if (p in need) print p, v, a, f }' "$pkgs")
}
link_debs
if ((${#missing[@]})); then
	log "apt-get download: ${#missing[@]} packages of the base system"
	(cd "$debs" && apt-get -q -o APT::Sandbox::User=root download "${missing[@]}") >&2 ||
		die "apt-get download of the base system's packages failed (no network?)"
	link_debs
	((${#missing[@]} == 0)) || die "still not in $debs after apt-get download: ${missing[*]}"
fi

log "debootstrap --variant=minbase $suite ($(wc -w <<<"$base") packages, from the cache)"
if ! debootstrap --variant=minbase "$suite" "$root" "file://$local_mirror" >&2; then
	tail -n 20 "$root/debootstrap/debootstrap.log" >&2 || true
	die "debootstrap $suite failed"
fi

# The rest is installed by the image's own apt from the host's lists: the same versions
# (security updates included) that apt-get download gives the busybox guest, with no second
# list download.
cat >"$root/etc/apt/sources.list" <<EOF
deb $mirror $suite main
deb $mirror $suite-updates main
deb $security $suite-security main
EOF
host_lists | xargs cp -t "$root/var/lib/apt/lists/"
find "$debs" -maxdepth 1 -name '*.deb' -exec mv -t "$root/var/cache/apt/archives/" {} +
# dpkg's fsyncs buy nothing for a throwaway build tree; the option file is removed again.
echo force-unsafe-io >"$root/etc/dpkg/dpkg.cfg.d/zz-build-unsafe-io"
# No daemons start inside the chroot.
printf '#!/bin/sh\nexit 101\n' >"$root/usr/sbin/policy-rc.d"
chmod 755 "$root/usr/sbin/policy-rc.d"
mount -t proc proc "$root/proc"
mount -t sysfs sysfs "$root/sys"
in_root() { LC_ALL=C.UTF-8 DEBIAN_FRONTEND=noninteractive chroot "$root" "$@"; }
log "apt-get install ${packages[*]}"
in_root apt-get -q -y -o APT::Sandbox::User=root --no-install-recommends install "${packages[@]}" >&2 ||
	die "apt-get install in the image failed"
in_root apt-get -q -y -o APT::Sandbox::User=root --no-install-recommends dist-upgrade >&2 ||
	die "apt-get dist-upgrade in the image failed"
find "$root/var/cache/apt/archives" -maxdepth 1 -name '*.deb' -exec mv -f -t "$debs" {} +
unmount_all

log "configure"
rm -f "$root/usr/sbin/policy-rc.d" "$root/etc/dpkg/dpkg.cfg.d/zz-build-unsafe-io"
echo debian >"$root/etc/hostname"
cat >"$root/etc/hosts" <<'EOF'
127.0.0.1	localhost
127.0.1.1	debian

::1	localhost ip6-localhost ip6-loopback
ff02::1	ip6-allnodes
ff02::2	ip6-allrouters
EOF
echo '/dev/vda / ext4 errors=remount-ro 0 1' >"$root/etc/fstab"
# debootstrap copied the build host's; the guest's DHCP client writes its own.
: >"$root/etc/resolv.conf"
# Both network stacks are configured as their users configure them; the boot variant masks one.
cat >"$root/etc/network/interfaces" <<'EOF'
source /etc/network/interfaces.d/*

auto lo
iface lo inet loopback

auto eth0
iface eth0 inet dhcp
EOF
mkdir -p "$root/etc/systemd/network"
cat >"$root/etc/systemd/network/eth0.network" <<'EOF'
[Match]
Name=eth0

[Network]
DHCP=ipv4
EOF
in_root systemctl enable systemd-networkd.service >&2
# An empty machine-id, as in Debian's cloud images: every boot of the image gets its own.
: >"$root/etc/machine-id"
rm -f "$root/var/lib/dbus/machine-id"
mkdir -p "$root/var/lib/dbus"
ln -s /etc/machine-id "$root/var/lib/dbus/machine-id"
# Small image: no apt lists, docs, man pages or logs of the build; the initrd is an output.
krel=$(basename "$(find "$root/boot" -maxdepth 1 -name 'vmlinuz-*' | LC_ALL=C sort -V | tail -n1)")
krel=${krel#vmlinuz-}
[[ -n $krel && -f $root/boot/initrd.img-$krel ]] || die "no kernel and initrd in the image's /boot"
grep -qx 'CONFIG_VMGENID=y' "$root/boot/config-$krel" || die "kernel $krel lacks CONFIG_VMGENID=y"
cp "$root/boot/vmlinuz-$krel" "$out/vmlinuz"
cp "$root/boot/initrd.img-$krel" "$out/initrd.img"
rm -f "$root/boot/initrd.img-$krel"
printf '%s\n' "$krel" >"$out/kernel-release"
in_root dpkg-query -W -f='${Package} ${Version}\n' | LC_ALL=C sort >"$tmp/packages"
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb \
	"$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/debootstrap \
	"$root"/var/log/*.log "$root"/var/log/apt/* "$root"/tmp/* "$root"/var/tmp/*
variants >"$out/variants"

log "make root.qcow2"
used_kib=$(du -sk --apparent-size "$root" | cut -f1)
# Room for what tests install or write; unused blocks cost nothing in the qcow2.
size_mib=$((used_kib / 1024 + 1024))
# Inode tables and journal are zeroed now (not lazily by every booted guest), and qemu-img
# leaves zero clusters out of the qcow2.
mke2fs -q -F -t ext4 -L debian-root -m 0 -E lazy_itable_init=0,lazy_journal_init=0 \
	-d "$root" "$tmp/root.img" "${size_mib}M"
qemu-img convert -f raw -O qcow2 -c "$tmp/root.img" "$out/root.qcow2"
rm -f "$tmp/root.img"

{
	printf '%s\n' "$header"
	sed 's/^/package /' "$tmp/packages"
	(cd "$out" && sha256sum "${outputs[@]}") | sed 's/^/output /'
	(cd "$out" && stat -c 'size %s %n' "${outputs[@]}")
} >"$out/stamp"
chmod a-w "$out"/*
# A build directory with this id that failed the check above is incomplete or was changed
# by hand: nothing consistent can use it.
[[ $(readlink "$outdir/current" 2>/dev/null) != "$id" ]] || rm -f "$outdir/current"
rm -rf "$build"
mv "$out" "$build"
use_build
# Keep the newest two builds: machines of the one before may still run.
find "$outdir" -mindepth 1 -maxdepth 1 -type d -regex '.*/[0-9a-f]\{12\}' -printf '%T@ %p\n' |
	LC_ALL=C sort -rn | tail -n +3 | cut -d' ' -f2- | while read -r old; do
	log "removing old build $old"
	rm -rf "$old"
done
log "done in $((SECONDS - started)) s: kernel $krel, root.qcow2 $(du -h "$build/root.qcow2" | cut -f1), initrd.img $(du -h "$build/initrd.img" | cut -f1)"
printf '%s\n' "$build" >&3
