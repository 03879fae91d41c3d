// Package brport waits for a new bridge port to forward.
package brport

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// A new tap on a bridge that runs STP does not forward at once: the kernel
// holds the port listening, then learning, for the bridge's forward delay
// each, and that delay is at least 2 s while STP runs. libvirt's own default
// network (stp='on' delay='0') holds every new port 4.1 s (measured); a
// bridge made with `ip link add ... type bridge stp_state 1` and the default
// delay, 30 s. Whatever the guest sends meanwhile is dropped, its DHCP
// client's first DISCOVER among them, and ISC dhclient sends the next one
// 3-8 s later (udhcpc, as vmfork runs it, 2 s). So the drivers' SetLink
// raise a child's link only once its tap's port forwards, and the wait is
// part of the identity chain's network step rather than a client's back-off.

// sysClassNet is where the kernel lists network interfaces (a test's
// directory in tests).
var sysClassNet = "/sys/class/net"

// Bridge port states, as brport/state reads them (the kernel's BR_STATE_*).
const (
	portListening = 1
	portLearning  = 2
)

// WaitForwarding waits until bridge port tap is past listening and
// learning, at most two of its bridge's forward delays and a second (a
// port that STP blocks, or one made disabled, is not waited for: neither
// ends by itself). It returns how long it waited. It never fails: a link
// raised too early costs the guest a retransmission, not its network.
func WaitForwarding(ctx context.Context, tap string) time.Duration {
	state := func() int {
		b, err := os.ReadFile(filepath.Join(sysClassNet, tap, "brport", "state"))
		if err != nil {
			return -1
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			return -1
		}
		return n
	}
	if s := state(); s != portListening && s != portLearning {
		return 0
	}
	start := time.Now()
	// forward_delay is in hundredths of a second (USER_HZ).
	limit := 61 * time.Second // STP's longest: 2 × 30 s
	if b, err := os.ReadFile(filepath.Join(sysClassNet, tap, "master", "bridge", "forward_delay")); err == nil {
		if cs, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			limit = time.Second + 2*time.Duration(cs)*10*time.Millisecond
		}
	}
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return time.Since(start)
		case <-t.C:
		}
		if s := state(); (s != portListening && s != portLearning) || time.Since(start) > limit {
			return time.Since(start)
		}
	}
}
