//go:build integration

package tests

import (
	"os"
	"strconv"
	"sync"
	"testing"
	"time"
)

// The order parallel tests run in (tests/doc.go, "Parallel"). go test
// releases its paused parallel tests in an order of its own (in practice
// the last file's first) and a parallel subtest waits for a slot until its
// parent returns, so the suite's longest work (the Debian variants, the
// conformance suites) queued behind everything else and ran alone at the
// end: a tail of minutes on a 2-core host with cores to spare. So make
// integration lifts go test's own limit (-parallel 64) and the tests take
// slots from this scheduler instead, longest expected first (LPT): the
// makespan of a list scheduled longest first is within 4/3 of the best.

// testSlots is how many slotted tests run at once: VMFORK_TEST_SLOTS, or 4.
// Tests wait on guests, timers and daemons much of the time: on a 2-core
// TCG host make test took 1466 s with three at once and 1291 s with four,
// every test passing, the CPUs still idle 15% of that run (2026-12-02).
func testSlots() int {
	if n, err := strconv.Atoi(os.Getenv("VMFORK_TEST_SLOTS")); err == nil && n > 0 {
		return n
	}
	return 4
}

// expectedSeconds is each long test's time on a 2-core TCG host (a CI run
// of make test, 2026-12), the scheduler's priority: longest first. A test
// not listed counts as defaultExpected. The figures only order the queue;
// a stale one costs minutes of tail, never a failure.
var expectedSeconds = map[string]int{
	"TestForkTo":                         55,
	"TestLibvirtForkTo":                  90,
	"TestStopKeepsChildWrites":           45,
	"TestIdentityDebian/ifupdown-dbus":   140,
	"TestIdentityDebian/ifupdown-nodbus": 140,
	"TestIdentityDebian/networkd-dbus":   140,
	"TestIdentityDebian/networkd-nodbus": 140,
	"TestConformanceDebian/libvirt":      150,
	"TestConformanceDebian/qemu":         120,
	"TestContractSecretsDebian":          135,
	"TestSecretFilesDebian":              130,
	"TestCrashMatrix":                    160,
	"TestAnsibleDebianModules":           130,
	"TestLedgerForkRace":                 110,
	"TestCrashMatrixLibvirt":             100,
	"TestConformance/libvirt":            105, // with Start, a cold boot
	"TestConformance/qemu":               95,
	"TestConcurrency":                    80,
	"TestFlatPauseLoop":                  75,
	"TestDeltaForks":                     45,
	"TestLibvirtFlatPause":               70,
	"TestLibvirtDeltaForks":              100, // 31.6 s alone, 105 s in a make test slot (CI 2026-12-02)
	"TestLibvirtDeltaLifecycle":          90,  // 39 s alone: a boot, 4 forks, rewind, hibernate and resume, export and import
	"TestContractLibvirtNetwork":         70,
	"TestContractUserNetwork":            65,
	"TestCheckpointRewind":               60,
	"TestNetworkLibvirtChildren/network": 60,
	"TestNetworkLibvirtChildren/bridge":  60,
	"TestLibvirtKeptTemplate":            60,
	"TestLibvirtDiskPolicies":            50,
	"TestLibvirtHungCalls":               55,
	"TestLibvirtSession":                 45, // a boot, two forks, a template save and its fork, stop and start, as a user; two session daemons (41.4 s here)
}

const defaultExpected = 30

// slots hands out testSlots() slots, to the waiter expected to run longest.
// Nothing is handed out until gather after the first request: go test
// releases every paused test at once, and the first few to arrive must not
// take the slots before the long ones have asked.
type slotScheduler struct {
	mu      sync.Mutex
	free    int
	open    bool
	started bool
	waiting []*slotWaiter
}

type slotWaiter struct {
	expected int
	ready    chan struct{}
}

const gather = 500 * time.Millisecond

var slots = &slotScheduler{free: testSlots()}

// parallel is t.Parallel() for a test that works itself: it waits for a
// slot (longest expected first) and gives it back when it and its subtests
// end. A test whose subtests are parallel calls parallelParent instead.
//
// go test's own time for such a test counts its wait for a slot too, so
// the test logs its time in the slot when it ends ("slot: NAME ran N s after
// waiting M s"), which .ci/run reports as the test's time.
func parallel(t *testing.T) {
	t.Helper()
	t.Parallel()
	asked := time.Now()
	release := slots.acquire(t.Name())
	got := time.Now()
	t.Cleanup(func() {
		release()
		t.Logf("slot: %s ran %.1f s after waiting %.1f s", t.Name(), time.Since(got).Seconds(), got.Sub(asked).Seconds())
	})
}

// parallelParent is t.Parallel() for a test that only starts parallel
// subtests: it holds no slot (its subtests wait for theirs after it
// returns, and a parent holding one would starve them).
func parallelParent(t *testing.T) {
	t.Helper()
	t.Parallel()
}

// acquire blocks until name has a slot and returns its release.
func (s *slotScheduler) acquire(name string) (release func()) {
	w := &slotWaiter{expected: defaultExpected, ready: make(chan struct{})}
	if n, ok := expectedSeconds[name]; ok {
		w.expected = n
	}
	s.mu.Lock()
	s.waiting = append(s.waiting, w)
	if !s.started {
		s.started = true
		time.AfterFunc(gather, func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.open = true
			s.dispatchLocked()
		})
	}
	s.dispatchLocked()
	s.mu.Unlock()
	<-w.ready
	return sync.OnceFunc(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.free++
		s.dispatchLocked()
	})
}

// dispatchLocked gives free slots to the longest expected waiters, first
// come first among equals.
func (s *slotScheduler) dispatchLocked() {
	for s.open && s.free > 0 && len(s.waiting) > 0 {
		best := 0
		for i, w := range s.waiting {
			if w.expected > s.waiting[best].expected {
				best = i
			}
		}
		w := s.waiting[best]
		s.waiting = append(s.waiting[:best], s.waiting[best+1:]...)
		s.free--
		close(w.ready)
	}
}
