//go:build integration

package tests

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// sniffer records every frame that arrives on an interface of a network
// namespace (a tap's frames as the guest sent them), so a test can say what
// a machine put on a bridge.
type sniffer struct {
	fd     int
	mu     sync.Mutex
	frames []frame
	done   chan struct{}
}

// frame is one captured frame's header: the interface it arrived on, its
// Ethernet source and type, and an ARP frame's sender address.
type frame struct {
	ifindex   int
	src       net.HardwareAddr
	etherType uint16
	arpSender net.IP
}

func (f frame) String() string {
	s := fmt.Sprintf("if %d, from %s, type %#04x", f.ifindex, f.src, f.etherType)
	if f.arpSender != nil {
		s += ", ARP sender " + f.arpSender.String()
	}
	return s
}

const etherTypeRARP = 0x8035

// sniffNamespace captures in namespace ns until the test ends.
func sniffNamespace(t testing.TB, ns string) *sniffer {
	t.Helper()
	type made struct {
		fd  int
		err error
	}
	ch := make(chan made, 1)
	go func() {
		// A packet socket belongs to the namespace it was made in. The
		// thread that joins ns stays locked, so it ends with this
		// goroutine instead of serving others from inside ns.
		runtime.LockOSThread()
		f, err := os.Open("/run/netns/" + ns)
		if err != nil {
			ch <- made{err: err}
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- made{err: fmt.Errorf("setns %s: %w", ns, err)}
			return
		}
		proto := int(htons(unix.ETH_P_ALL))
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, proto)
		ch <- made{fd, err}
	}()
	m := <-ch
	if m.err != nil {
		t.Fatalf("capture in namespace %s: %v", ns, m.err)
	}
	s := &sniffer{fd: m.fd, done: make(chan struct{})}
	go s.read()
	t.Cleanup(func() {
		unix.Shutdown(s.fd, unix.SHUT_RDWR)
		unix.Close(s.fd)
		<-s.done
	})
	return s
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func (s *sniffer) read() {
	defer close(s.done)
	buf := make([]byte, 65536)
	for {
		n, from, err := unix.Recvfrom(s.fd, buf, 0)
		if err != nil || n == 0 {
			return
		}
		ll, ok := from.(*unix.SockaddrLinklayer)
		if !ok || ll.Pkttype == unix.PACKET_OUTGOING || n < 14 {
			continue // each frame once: where it comes in
		}
		f := frame{ifindex: ll.Ifindex, src: bytes.Clone(buf[6:12]), etherType: binary.BigEndian.Uint16(buf[12:14])}
		if f.etherType == unix.ETH_P_ARP && n >= 32 {
			f.arpSender = net.IP(bytes.Clone(buf[28:32]))
		}
		s.mu.Lock()
		s.frames = append(s.frames, f)
		s.mu.Unlock()
	}
}

// from returns the frames captured so far that arrived on interface ifindex.
func (s *sniffer) from(ifindex int) []frame {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []frame
	for _, f := range s.frames {
		if f.ifindex == ifindex {
			out = append(out, f)
		}
	}
	return out
}

// ifindexes maps the interfaces plugged into b's bridge to their indexes.
func (b *bridgeNet) ifindexes(t testing.TB) map[string]int {
	t.Helper()
	out, err := exec.Command("ip", "-n", b.ns, "-o", "link", "show", "master", b.bridge).Output()
	if err != nil {
		t.Fatalf("ip link show master %s: %v", b.bridge, err)
	}
	m := map[string]int{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		// "7: vmf0@...: <BROADCAST,...> ..." or "7: vmf0: <...>"
		w := strings.Fields(l)
		if len(w) < 2 {
			continue
		}
		i, err := strconv.Atoi(strings.TrimSuffix(w[0], ":"))
		if err != nil {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(w[1], ":"), "@")
		m[name] = i
	}
	return m
}

// checkNoLeak fails t for each frame that came in on a bridge port other
// than the source's (srcIf) and announced the source: its MAC, its address
// as an ARP sender, or any RARP frame (QEMU's announcement after a load;
// vmfork announces a child with gratuitous ARP once it has its own
// identity, never with RARP).
func (s *sniffer) checkNoLeak(t *testing.T, ports map[string]int, srcIf int, srcMAC, srcIP string) {
	t.Helper()
	seen := 0
	for name, i := range ports {
		if i == srcIf {
			continue
		}
		frames := s.from(i)
		seen += len(frames)
		for _, f := range frames {
			if f.etherType == etherTypeRARP || f.src.String() == srcMAC || (f.arpSender != nil && f.arpSender.String() == srcIP) {
				t.Errorf("port %s announced what is not its own: %s (the source is %s, %s)", name, f, srcMAC, srcIP)
			}
		}
	}
	if seen == 0 {
		// Each child asks for a lease: a capture that saw nothing is broken.
		t.Errorf("the capture saw no frame from the children's ports %v", ports)
	}
}
