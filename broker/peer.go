package broker

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// A machine on QEMU's user network reaches its proxy on the host's
// loopback (the guest dials 10.0.2.2, and QEMU's slirp connects from the
// host): every such machine arrives from 127.0.0.1. What tells them apart
// is which process holds the connecting socket: the machine's own QEMU.
// peerHeldBy finds the peer's socket in /proc/net/tcp{,6} by its address
// (it is local: this host is both ends) and looks for it among the
// descriptors of process pid.

// peerHeldBy reports whether the other end of TCP connection c is a
// socket held by process pid, on this host.
func peerHeldBy(c net.Conn, pid int) (bool, error) {
	if pid <= 0 {
		return false, nil
	}
	ra, ok := c.RemoteAddr().(*net.TCPAddr)
	la, ok2 := c.LocalAddr().(*net.TCPAddr)
	if !ok || !ok2 {
		return false, fmt.Errorf("not a TCP connection")
	}
	peer, local := ra.AddrPort(), la.AddrPort()
	inode, err := socketInode(peer, local)
	if err != nil || inode == "" {
		return false, err
	}
	fds, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "fd"))
	if err != nil {
		return false, nil // gone, or not ours to see: not its socket
	}
	want := "socket:[" + inode + "]"
	for _, fd := range fds {
		if l, err := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "fd", fd.Name())); err == nil && l == want {
			return true, nil
		}
	}
	return false, nil
}

// socketInode returns the inode of the TCP socket bound to src and
// connected to dst, from /proc/net/tcp or tcp6; "" when there is none.
func socketInode(src, dst netip.AddrPort) (string, error) {
	files := []string{"/proc/net/tcp", "/proc/net/tcp6"}
	for _, f := range files {
		inode, err := scanTCP(f, src, dst)
		if err != nil || inode != "" {
			return inode, err
		}
	}
	return "", nil
}

func scanTCP(file string, src, dst netip.AddrPort) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", nil // no IPv6 here, say
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 {
			continue
		}
		l, lerr := parseProcAddr(fields[1])
		r, rerr := parseProcAddr(fields[2])
		if lerr != nil || rerr != nil {
			continue
		}
		if sameEnd(l, src) && sameEnd(r, dst) {
			return fields[9], nil
		}
	}
	return "", sc.Err()
}

func sameEnd(a, b netip.AddrPort) bool {
	return a.Port() == b.Port() && a.Addr().Unmap() == b.Addr().Unmap()
}

// parseProcAddr parses /proc/net/tcp's ADDR:PORT: the address in hex, as
// the kernel keeps it (32-bit words in host order), the port in hex.
func parseProcAddr(s string) (netip.AddrPort, error) {
	a, p, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("%q", s)
	}
	raw, err := hex.DecodeString(a)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, fmt.Errorf("%q", s)
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.AddrPort{}, err
	}
	// Each 32-bit word is in the host's order (little-endian on x86).
	b := make([]byte, len(raw))
	for i := 0; i < len(raw); i += 4 {
		binary.BigEndian.PutUint32(b[i:], binary.LittleEndian.Uint32(raw[i:]))
	}
	addr, _ := netip.AddrFromSlice(b)
	return netip.AddrPortFrom(addr, uint16(port)), nil
}
