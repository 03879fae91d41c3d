//go:build integration

package tests

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vmfork/vmfork/qmp"
)

// identityJSON is a child's "identity" in the fork's JSON.
type identityJSON struct {
	Mode      string   `json:"mode"`
	MAC       string   `json:"mac"`
	Hostname  string   `json:"hostname"`
	Addresses []string `json:"addresses"`
	MachineID string   `json:"machine_id"`
	VMGenID   string   `json:"vmgenid"`
	ElapsedMS float64  `json:"elapsed_ms"`
	// OverheadMS is the chain's time in no step: batched steps' durations
	// are measured in the guest.
	OverheadMS    float64    `json:"overhead_ms"`
	GuestCommands int        `json:"guest_commands"`
	Steps         []stepJSON `json:"steps"`
}

type stepJSON struct {
	Name       string  `json:"name"`
	Status     string  `json:"status"`
	DurationMS float64 `json:"duration_ms"`
	Detail     string  `json:"detail"`
	Error      string  `json:"error"`
	ExitCode   *int    `json:"exit_code"`
	StderrTail string  `json:"stderr_tail"`
}

func (id *identityJSON) step(name string) stepJSON {
	for _, s := range id.Steps {
		if s.Name == name {
			return s
		}
	}
	return stepJSON{Name: name, Status: "missing"}
}

// forkIDJSON is the fork's JSON with the identity results.
type forkIDJSON struct {
	Template string  `json:"template"`
	PauseMS  float64 `json:"pause_ms"`
	Children []struct {
		Name      string        `json:"name"`
		PID       int           `json:"pid"`
		RunningMS float64       `json:"running_ms"`
		ReadyMS   float64       `json:"ready_ms"`
		Identity  *identityJSON `json:"identity"`
	} `json:"children"`
	Failed []struct {
		Name     string        `json:"name"`
		Error    string        `json:"error"`
		Identity *identityJSON `json:"identity"`
	} `json:"failed"`
}

// forkID runs a fork with --json, checks its exit code and decodes it.
func (e *env) forkID(code int, args ...string) (forkIDJSON, result) {
	e.t.Helper()
	r := e.vmfork(append([]string{"fork"}, append(args, "--json")...)...)
	if r.code != code {
		e.t.Fatalf("vmfork fork %s: %s, want exit %d", strings.Join(args, " "), r, code)
	}
	var res forkIDJSON
	if err := jsonDecode(r.stdout, &res); err != nil {
		e.t.Fatalf("fork JSON: %v\n%s", err, r.stdout)
	}
	return res, r
}

// install writes an executable file into machine name's guest.
func (e *env) install(name, path, content string) {
	e.t.Helper()
	r := e.vmforkIn(content, "exec", "--stdin", name, "--", "sh", "-c", `mkdir -p "${1%/*}" && cat >"$1" && chmod 755 "$1"`, "sh", path)
	if r.code != 0 {
		e.t.Fatalf("install %s in %s: %s", path, name, r)
	}
}

// machine returns machine name's record from ls.
func (e *env) machine(name string) machineJSON {
	e.t.Helper()
	for _, m := range e.list() {
		if m.Name == name {
			return m
		}
	}
	e.t.Fatalf("no machine %s", name)
	return machineJSON{}
}

// guestClockOffset returns how far machine name's clock is from the host's,
// read through its guest agent with the host time taken at the middle of
// the round trip.
func (e *env) guestClockOffset(name string) time.Duration {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), 30*time.Second)
	defer cancel()
	a, err := qmp.DialAgent(ctx, e.machine(name).QGA)
	if err != nil {
		e.t.Fatalf("agent of %s: %v", name, err)
	}
	defer a.Close()
	best := time.Duration(1<<63 - 1)
	var off time.Duration
	for range 3 { // the shortest round trip measures best
		t0 := time.Now()
		g, err := a.GetTime(ctx)
		t1 := time.Now()
		if err != nil {
			e.t.Fatalf("guest time of %s: %v", name, err)
		}
		if rtt := t1.Sub(t0); rtt < best {
			best, off = rtt, g.Sub(t0.Add(rtt/2))
		}
	}
	return off
}

// qmpCall runs one QMP command on machine name's QEMU and fails the test if
// it fails.
func (e *env) qmpCall(name, command string, args, out any) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.t.Context(), 30*time.Second)
	defer cancel()
	mon, err := qmp.Dial(ctx, e.machine(name).QMP)
	if err != nil {
		e.t.Fatalf("QMP of %s: %v", name, err)
	}
	defer mon.Close()
	if err := mon.Execute(ctx, command, args, out); err != nil {
		e.t.Fatalf("%s on %s: %v", command, name, err)
	}
}

// rxFilterMAC is the MAC QEMU's NIC of machine name receives for (its
// receive filter's main-mac), which follows the guest's choice.
func (e *env) rxFilterMAC(name string) string {
	e.t.Helper()
	var filters []struct {
		Name    string `json:"name"`
		MainMAC string `json:"main-mac"`
	}
	e.qmpCall(name, "query-rx-filter", map[string]string{"name": "nic0"}, &filters)
	if len(filters) != 1 {
		e.t.Fatalf("query-rx-filter on %s: %+v, want one filter", name, filters)
	}
	return filters[0].MainMAC
}

// uptime returns machine name's uptime in seconds.
func (e *env) uptime(name string) float64 {
	e.t.Helper()
	f := strings.Fields(e.exec(name, "cat", "/proc/uptime"))
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		e.t.Fatalf("uptime of %s: %v", name, err)
	}
	return v
}

// crngInitAt returns the uptime at which machine name's kernel logged
// "crng init done", or -1.
func (e *env) crngInitAt(name string) float64 {
	e.t.Helper()
	for _, l := range strings.Split(e.exec(name, "dmesg"), "\n") {
		if strings.Contains(l, "crng init done") {
			ts := strings.TrimSpace(strings.Trim(strings.SplitN(l, "]", 2)[0], "["))
			v, err := strconv.ParseFloat(ts, 64)
			if err != nil {
				e.t.Fatalf("kernel log line %q: %v", l, err)
			}
			return v
		}
	}
	return -1
}

// writeSpec writes a customization spec for the fork's --customize.
func writeSpec(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "identity.yaml")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// rndHook reads 16 bytes of the kernel CRNG at a fixed point of the
// identity chain, the post-fork hooks: after vmfork.rng has confirmed the
// reseed. Its uptime says when.
const rndHook = `#!/bin/sh
read -r up _ </proc/uptime
head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' >/run/rnd-at-fork
echo "$up" >/run/uptime-at-fork
`

// rndWatch reads the kernel CRNG at a child's first instant, before
// anything else in the guest can use it. It spins until the NIC's carrier
// goes (a fork child starts with its link down, so that is the first thing
// its kernel does), then reads /dev/urandom with the shell's own read:
// between the resume and the read nothing forks, so nothing consumes random
// bytes (every exec does, for ASLR and AT_RANDOM). Later reads can differ
// between children even with a reproducible identity: the kernel's own
// users (kfence sampling, slab freelist shuffling) take random bytes at
// times that depend on how the host schedules each child.
const rndWatch = `#!/bin/sh
echo $$ >/run/rndwatch.pid
while read -r c </sys/class/net/eth0/carrier && [ "$c" = 1 ]; do :; done
x=
while [ ${#x} -lt 24 ]; do
	read -r -n 24 y </dev/urandom
	x=$x$y
done
read -r up _ </proc/uptime
printf '%s' "$x" | od -An -tx1 | tr -d ' \n' >/run/rnd-at-resume
echo "$up" >/run/uptime-at-resume
`

// sameStream reports whether two hex strings of what rndWatch read come from
// one CRNG state: equal, or one the other shifted by up to 8 bytes, 16 bytes
// of them matching. busybox's read takes the stream a byte per read(2), and
// the kernel draws from its CRNG per call: a timer in one child that drew
// once more before the watcher read (the guest's timers follow host time under
// TCG, so a loaded host shifts them) moves the stream by a byte, where a
// reseeded CRNG gives other bytes altogether.
func sameStream(a, b string) bool {
	const window = 32 // hex digits: 16 bytes
	for k := 0; k <= 16; k += 2 {
		if len(a) >= k+window && len(b) >= window && (a[k:k+window] == b[:window]) {
			return true
		}
		if len(b) >= k+window && len(a) >= window && (b[k:k+window] == a[:window]) {
			return true
		}
	}
	return false
}

// armHook is a pre-fork hook that starts rndWatch just before the freeze.
const armHook = `#!/bin/sh
rm -f /run/rndwatch.pid
setsid /run/rndwatch </dev/null >/dev/null 2>&1 &
while [ ! -s /run/rndwatch.pid ]; do usleep 10000; done
`

// TestSameStream checks sameStream on made-up streams: one CRNG's bytes
// shifted by a draw or two match, other bytes do not.
func TestSameStream(t *testing.T) {
	a := "923ea9d5ee56d9de12cc3dd5658a37cad40011223344556677"
	for _, c := range []struct {
		b    string
		want bool
	}{
		{a, true},
		{a[2:] + "88", true},        // a one more draw behind
		{"ff" + a[:len(a)-2], true}, // a one draw ahead
		{a[18:] + "000000000000000000", false},
		{"0123456789abcdef0123456789abcdef0123456789abcdef01", false},
	} {
		if got := sameStream(a, c.b); got != c.want {
			t.Errorf("sameStream(%s, %s) = %v, want %v", a, c.b, got, c.want)
		}
	}
}
