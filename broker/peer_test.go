package broker

import (
	"net"
	"os"
	"testing"
)

// The other end of a loopback connection this process made is held by
// this process, and by no other.
func TestPeerHeldBy(t *testing.T) {
	for _, network := range []string{"tcp4", "tcp6"} {
		addr := "127.0.0.1:0"
		if network == "tcp6" {
			addr = "[::1]:0"
		}
		l, err := net.Listen(network, addr)
		if err != nil {
			t.Logf("%s: %v (skipped: no such loopback here)", network, err)
			continue
		}
		defer l.Close()
		out, err := net.Dial(network, l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer out.Close()
		in, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer in.Close()
		if ok, err := peerHeldBy(in, os.Getpid()); !ok || err != nil {
			t.Errorf("%s: peerHeldBy(self) = %v, %v; want true", network, ok, err)
		}
		if ok, _ := peerHeldBy(in, os.Getppid()); ok {
			t.Errorf("%s: peerHeldBy(parent) = true; want false", network)
		}
		if ok, _ := peerHeldBy(in, 0); ok {
			t.Errorf("%s: peerHeldBy(0) = true; want false", network)
		}
	}
}
