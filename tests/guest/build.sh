#!/usr/bin/env bash
# Builds the vmfork test guest: a Debian 12 generic kernel, an initramfs with busybox-static,
# qemu-guest-agent and iproute2's ss (plus the host's copies of their shared libraries) and a
# few modules, and a small ext4 data disk. Debian packages only, fetched with apt-get download.
#
# Usage: tests/guest/build.sh [OUTDIR]     (default: tests/guest/out next to this script)
#
# Outputs in OUTDIR: vmlinuz, initrd.gz, data.qcow2, kernel-release, stamp.
# Progress goes to stderr; stdout carries only the absolute OUTDIR path.
# A second run is a no-op while the stamp matches the inputs (this script, init, rootfs/,
# the family ledger's guest helper ledger/vmfork-ledger),
# the chosen package versions and the host libraries copied into the initramfs.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec 3>&1 1>&2 # everything but the final path goes to stderr

log() { printf 'guest-build: %s\n' "$*" >&2; }
die() {
	log "error: $*"
	exit 1
}

# Modules the guest insmods, in this order after their dependencies (modinfo depends).
# crc32c_generic is ext4's and jbd2's softdep ("pre: crypto-crc32c"): without it a
# metadata_csum filesystem does not mount, and there is no modprobe to load it on demand.
# crc32c-intel is not used because -cpu qemu64 has no SSE4.2.
# inet_diag and tcp_diag answer ss's sock_diag requests for TCP sockets, and tcp_diag destroys
# them for ss -K (CONFIG_INET_DIAG_DESTROY=y, checked below); sock_diag itself is built in.
# Without them ss lists from /proc/net/tcp and cannot destroy anything.
modules=(virtio_pci virtio_net virtio_blk virtio_console crc32c_generic ext4 inet_diag tcp_diag)
outputs=(vmlinuz initrd.gz data.qcow2 kernel-release)

for tool in apt-get apt-cache dpkg-deb cpio gzip mke2fs qemu-img sha256sum ldd flock find sort; do
	command -v "$tool" >/dev/null || die "$tool not found (Debian packages: apt, dpkg, cpio, gzip, e2fsprogs, qemu-utils, coreutils, libc-bin, util-linux, findutils)"
done

# The family ledger's guest helper ships in the repository, not in a package: the guest
# gets the repository's copy as /bin/vmfork-ledger (docs/LEDGER.md).
ledger_helper=$(cd "$here/../../ledger" && pwd)/vmfork-ledger
[[ -f $ledger_helper ]] || die "$ledger_helper not found"

outdir=${1:-$here/out}
mkdir -p "$outdir"
outdir=$(cd "$outdir" && pwd)

# Concurrent callers (parallel test packages) wait here; the loser then finds a matching stamp.
exec 9>"$outdir/.lock"
flock 9

apt_opts=(-q)
if [[ $(id -u) -eq 0 ]]; then
	# Root's temp dir is not readable by _apt; skip the sandbox instead of printing a warning.
	apt_opts+=(-o APT::Sandbox::User=root)
fi

# select_packages sets kpkg, kver, qgaver, bbver, ipver; it fails if apt's lists lack any of them.
# Two apt-cache calls only: each one can take half a second where pkgcache.bin is disabled.
select_packages() {
	# The generic flavour: it has CONFIG_VMGENID=y, the cloud kernel has no vmgenid driver.
	kpkg=$(apt-cache depends linux-image-amd64 2>/dev/null |
		awk '$1 == "Depends:" && $2 ~ /^linux-image-[0-9][0-9.]*-[0-9]+-amd64$/ { print $2; exit }')
	[[ -n $kpkg ]] || return 1
	local policy
	policy=$(apt-cache policy "$kpkg" qemu-guest-agent busybox-static iproute2 2>/dev/null |
		awk '/^[^ ]/ { pkg = $1; sub(/:$/, "", pkg) } $1 == "Candidate:" { print pkg, $2 }')
	kver=$(awk -v p="$kpkg" '$1 == p { print $2 }' <<<"$policy")
	qgaver=$(awk '$1 == "qemu-guest-agent" { print $2 }' <<<"$policy")
	bbver=$(awk '$1 == "busybox-static" { print $2 }' <<<"$policy")
	ipver=$(awk '$1 == "iproute2" { print $2 }' <<<"$policy")
	local v
	for v in "$kver" "$qgaver" "$bbver" "$ipver"; do
		[[ -n $v && $v != "(none)" ]] || return 1
	done
}

if ! select_packages; then
	log "packages not in apt's lists; running apt-get update"
	apt-get "${apt_opts[@]}" update || die "apt-get update failed (needs root)"
	select_packages || die "cannot find linux-image-amd64's kernel, qemu-guest-agent, busybox-static or iproute2 in apt's lists"
fi
krel=${kpkg#linux-image-}

inputs_hash() {
	(
		cd "$here"
		find build.sh init rootfs -printf '%p %y %m %l\n' | LC_ALL=C sort
		find build.sh init rootfs -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
		sha256sum <"$ledger_helper" # by content: the path differs between checkouts
	) | sha256sum | cut -d' ' -f1
}

# The stamp is this header, then "hostlib <sha256>  <path>" for each host library copied into
# the initramfs and "output <sha256>  <file>" for each output.
header=$(
	printf 'vmfork-test-guest\n'
	printf 'package %s %s\n' "$kpkg" "$kver" qemu-guest-agent "$qgaver" busybox-static "$bbver" iproute2 "$ipver"
	printf 'inputs %s\n' "$(inputs_hash)"
)

up_to_date() {
	[[ -f $outdir/stamp ]] || return 1
	[[ $(grep -Ev '^(hostlib|output) ' "$outdir/stamp") == "$header" ]] || return 1
	[[ $(grep -c '^output ' "$outdir/stamp") -eq ${#outputs[@]} ]] || return 1
	grep '^hostlib ' "$outdir/stamp" | sed 's/^hostlib //' | sha256sum --status -c - 2>/dev/null || return 1
	(cd "$outdir" && grep '^output ' stamp | sed 's/^output //' | sha256sum --status -c - 2>/dev/null)
}

if up_to_date; then
	log "up to date: $outdir ($kpkg $kver)"
	printf '%s\n' "$outdir" >&3
	exit 0
fi

log "building into $outdir: $kpkg $kver, qemu-guest-agent $qgaver, busybox-static $bbver, iproute2 $ipver"
rm -f "$outdir/stamp"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/vmfork-guest.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/debs" "$tmp/x" "$tmp/out"

log "apt-get download"
(cd "$tmp/debs" && apt-get "${apt_opts[@]}" download \
	"$kpkg=$kver" "qemu-guest-agent=$qgaver" "busybox-static=$bbver" "iproute2=$ipver")
for pkg in "$kpkg" qemu-guest-agent busybox-static iproute2; do
	log "extract $pkg"
	debs=("$tmp/debs/${pkg}_"*.deb)
	[[ -f ${debs[0]} ]] || die "$pkg: no .deb downloaded"
	dpkg-deb -x "${debs[0]}" "$tmp/x/$pkg"
done

kroot=$tmp/x/$kpkg
moddir=$kroot/lib/modules/$krel
[[ -f $kroot/boot/vmlinuz-$krel ]] || die "$kpkg has no boot/vmlinuz-$krel"
[[ -d $moddir/kernel ]] || die "$kpkg has no lib/modules/$krel"
grep -qx 'CONFIG_VMGENID=y' "$kroot/boot/config-$krel" || die "$kpkg lacks CONFIG_VMGENID=y"
# ss -K (vmfork's connections step) needs the kernel's socket destroy.
grep -qx 'CONFIG_INET_DIAG_DESTROY=y' "$kroot/boot/config-$krel" || die "$kpkg lacks CONFIG_INET_DIAG_DESTROY=y"

stage=$tmp/root
mkdir -p "$stage"/{bin,sbin,usr/bin,usr/sbin,lib/modules,lib/x86_64-linux-gnu,lib64,etc,proc,sys,dev,run,tmp,data,root,var/lib,var/log}
ln -s ../run "$stage/var/run"

# --- kernel modules, flat in /lib/modules, load order in /lib/modules/order
declare -A modfile=() seen=()
order=()
while IFS= read -r -d '' f; do
	b=${f##*/}
	b=${b%%.ko*}
	modfile[${b//-/_}]=$f
done < <(find "$moddir/kernel" -name '*.ko*' -print0)

depends_of() { # depends_of PLAIN_KO: comma-separated module names
	if command -v modinfo >/dev/null && modinfo --version 2>/dev/null | grep -q kmod; then
		modinfo -F depends "$1"
	else # busybox modinfo needs modules.dep, so read the .modinfo strings directly
		tr '\0' '\n' <"$1" | sed -n 's/^depends=//p' | head -n1
	fi
}

add_module() {
	local name=${1//-/_} src dst deps d
	[[ -z ${seen[$name]:-} ]] || return 0
	seen[$name]=1
	src=${modfile[$name]:-}
	[[ -n $src ]] || die "module $name not found in $kpkg"
	dst=${src##*/}
	dst=$stage/lib/modules/${dst%%.ko*}.ko
	# busybox insmod may not read compressed modules
	case $src in
	*.ko) cp "$src" "$dst" ;;
	*.ko.xz) xz -dc "$src" >"$dst" ;;
	*.ko.zst) zstd -qdc "$src" >"$dst" ;;
	*.ko.gz) gzip -dc "$src" >"$dst" ;;
	*) die "unknown module format: $src" ;;
	esac
	deps=$(depends_of "$dst")
	IFS=, read -ra deps <<<"$deps"
	for d in "${deps[@]}"; do
		[[ -z $d ]] || add_module "$d"
	done
	order+=("${dst##*/}")
}
for m in "${modules[@]}"; do
	add_module "$m"
done
printf '%s\n' "${order[@]}" >"$stage/lib/modules/order"
log "modules: ${order[*]}"

# --- userland
cp "$tmp/x/busybox-static/bin/busybox" "$stage/bin/busybox"
qga=$tmp/x/qemu-guest-agent/usr/sbin/qemu-ga
cp "$qga" "$stage/usr/sbin/qemu-ga"
# ss alone of iproute2: ip stays busybox's, which the identity chain is tested with.
ss=$tmp/x/iproute2/bin/ss
[[ -f $ss ]] || die "iproute2 has no bin/ss"
cp "$ss" "$stage/bin/ss"

# The binaries' libraries come from the host (Debian 12 too), so they are hashed into the
# stamp. Each is copied once, at the path ldd names, however many binaries need it.
hostlibs=()
declare -A copied=() hashed=()
copy_libs() { # copy_libs BINARY
	local lib real n=0 new=()
	while read -r lib; do
		[[ -n $lib ]] || continue
		[[ $lib == /* && -f $lib ]] || die "${1##*/}: library not found on the host: $lib"
		n=$((n + 1))
		[[ -z ${copied[$lib]:-} ]] || continue
		copied[$lib]=1
		mkdir -p "$stage$(dirname "$lib")"
		cp -L "$lib" "$stage$lib"
		new+=("${lib##*/}")
		real=$(readlink -f "$lib")
		[[ -n ${hashed[$real]:-} ]] || hostlibs+=("$real")
		hashed[$real]=1
	done < <(ldd "$1" | awk '
		/not found/ { print $1; next }
		$2 == "=>" && $3 ~ /^\// { print $3; next }
		$1 ~ /^\// { print $1 }')
	[[ $n -gt 0 ]] || die "ldd found no libraries for ${1##*/}"
	log "${1##*/} libraries: ${new[*]:-(none new)}"
}
copy_libs "$qga"
copy_libs "$ss"

cp -R --preserve=mode "$here/rootfs/." "$stage/"
install -m 0755 "$ledger_helper" "$stage/bin/vmfork-ledger"
find "$stage" -name .keep -delete
chmod 600 "$stage/etc/shadow" # git keeps only the x bit
install -m 0755 "$here/init" "$stage/init"
if [[ $(id -u) -eq 0 ]]; then
	# The kernel opens /dev/console before devtmpfs is mounted; init redirects again later.
	mknod -m 600 "$stage/dev/console" c 5 1
fi

log "pack initrd.gz"
# Fixed mtimes, owners and inode numbers: the same inputs give the same initrd.gz.
find "$stage" -exec touch -h -d @0 {} +
(cd "$stage" && find . -print0 | LC_ALL=C sort -z |
	cpio --null -o -H newc -R 0:0 --reproducible --quiet) |
	gzip -9 -n >"$tmp/out/initrd.gz"
cp "$kroot/boot/vmlinuz-$krel" "$tmp/out/vmlinuz"
printf '%s\n' "$krel" >"$tmp/out/kernel-release"

log "make data.qcow2"
mkdir -p "$tmp/data"
cat >"$tmp/data/README" <<'EOF'
vmfork test guest data disk (ext4, label vmfork-data), mounted on /data by the guest's init.
Built by tests/guest/build.sh; tests write their own files next to this one.
EOF
truncate -s 64M "$tmp/data.img"
mke2fs -q -F -t ext4 -L vmfork-data -m 0 -E root_owner=0:0 -d "$tmp/data" "$tmp/data.img"
qemu-img convert -f raw -O qcow2 "$tmp/data.img" "$tmp/out/data.qcow2"

{
	printf '%s\n' "$header"
	for lib in "${hostlibs[@]}"; do
		printf 'hostlib %s  %s\n' "$(sha256sum "$lib" | cut -d' ' -f1)" "$lib"
	done
	(cd "$tmp/out" && sha256sum "${outputs[@]}") | sed 's/^/output /'
} >"$tmp/stamp"
for f in "${outputs[@]}"; do
	mv -f "$tmp/out/$f" "$outdir/$f"
done
mv -f "$tmp/stamp" "$outdir/stamp.tmp"
mv -f "$outdir/stamp.tmp" "$outdir/stamp"

log "done: initrd.gz $(stat -c %s "$outdir/initrd.gz") bytes, kernel $krel"
printf '%s\n' "$outdir" >&3
