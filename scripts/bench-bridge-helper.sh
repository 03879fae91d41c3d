#!/bin/sh
# Times what joining a bridge costs an ordinary user: qemu-bridge-helper run
# as vmfork runs it (--use-vnet --br=BR --fd=N, the tap's descriptor received
# over a socket pair), N times as nobody, on a bridge in a namespace of its
# own. Prints the median and the slowest. Everything it sets up (namespace,
# a setuid copy of the helper, the allow line, /dev/net/tun's mode) is undone
# on exit.
#
# Usage (as root): scripts/bench-bridge-helper.sh [N]
set -eu
n=${1:-20}
helper=${VMFORK_BRIDGE_HELPER:-/usr/lib/qemu/qemu-bridge-helper}
conf=/etc/qemu/bridge.conf
ns=vmfhb$$
br=vmfhbr$$
dir=$(mktemp -d)
tunmode=$(stat -c %a /dev/net/tun)
had_conf=$([ -e "$conf" ] && echo 1 || echo 0)
cleanup() {
	ip netns del "$ns" 2>/dev/null || true
	rm -rf "$dir"
	chmod "$tunmode" /dev/net/tun
	if [ "$had_conf" = 1 ]; then sed -i "/^allow $br\$/d" "$conf"; else rm -f "$conf"; fi
}
trap cleanup EXIT INT TERM
chmod 755 "$dir"
cp "$helper" "$dir/helper"
chmod 4755 "$dir/helper"
ip netns add "$ns"
ip -n "$ns" link add "$br" type bridge
ip -n "$ns" link set "$br" up
mkdir -p "$(dirname "$conf")"
echo "allow $br" >>"$conf"
chmod 666 /dev/net/tun
cat >"$dir/t.py" <<'PY'
import array, os, socket, subprocess, sys, time
helper, br, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
ms = []
for _ in range(n):
    a, b = socket.socketpair()
    t = time.monotonic()
    p = subprocess.run([helper, "--use-vnet", "--br=" + br, "--fd=%d" % b.fileno()],
                       pass_fds=[b.fileno()], capture_output=True, check=False)
    if p.returncode != 0:
        sys.exit("helper: %s" % p.stderr.decode().strip())
    _, anc, _, _ = a.recvmsg(1, socket.CMSG_LEN(4))
    ms.append((time.monotonic() - t) * 1000)
    fds = array.array("i")
    fds.frombytes(anc[0][2][:4])
    os.close(fds[0])
    a.close()
    b.close()
ms.sort()
print("qemu-bridge-helper: median %.1f ms, max %.1f ms over %d taps" % (ms[len(ms) // 2], ms[-1], n))
PY
ip netns exec "$ns" setpriv --reuid=65534 --regid=65534 --clear-groups /usr/bin/python3 "$dir/t.py" "$dir/helper" "$br" "$n"
