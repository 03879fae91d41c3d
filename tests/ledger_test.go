//go:build integration

package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The family ledger (docs/LEDGER.md) with real guests: every machine's
// org.vmfork.ledger.0 port answers through `vmfork ledger-server`, which
// vmfork starts when a machine starts. Each test boots one parent and
// forks what it needs from it.

// guestHelper is where the busybox test guest has vmfork-ledger
// (tests/guest/build.sh).
const guestHelper = "/bin/vmfork-ledger"

// helperSource is the repository's copy of the guest helper.
func helperSource() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "ledger", "vmfork-ledger")
}

// withHelper makes sure machine name has the repository's vmfork-ledger
// at guestHelper: a guest built before it shipped there gets it with
// vmfork cp (as the Debian guest does), and its children inherit it.
func (d *driverEnv) withHelper(name string) {
	d.t.Helper()
	src := helperSource()
	want, err := os.ReadFile(src)
	if err != nil {
		d.t.Fatal(err)
	}
	if got := d.cli("exec", name, "--", "cat", guestHelper); got.code == 0 && got.stdout == string(want) {
		return
	}
	d.cliOK("cp", src, name+":"+guestHelper)
	d.run(name, "chmod", "0755", guestHelper)
}

// embedded is e as a driverEnv of the embedded driver, its names as given.
func (e *env) embedded() *driverEnv { return &driverEnv{env: e, driver: "qemu"} }

func (e *env) withHelper(name string) { e.t.Helper(); e.embedded().withHelper(name) }

// ledgerAnswer is one vmfork-ledger invocation in a guest.
type ledgerAnswer struct {
	machine string
	out     string // its stdout, trimmed
	code    int    // its exit code (0 granted/yours/ok, 1 taken, 2 error)
	err     string
}

// ledger runs vmfork-ledger ARGS in machine name.
func (d *driverEnv) ledger(name string, args ...string) ledgerAnswer {
	d.t.Helper()
	r := d.cli(append([]string{"exec", name, "--", guestHelper}, args...)...)
	return ledgerAnswer{machine: name, out: strings.TrimSpace(r.stdout), code: r.code, err: strings.TrimSpace(r.stderr)}
}

func (e *env) ledger(name string, args ...string) ledgerAnswer {
	e.t.Helper()
	return e.embedded().ledger(name, args...)
}

// shConcurrently runs sh -c script in every machine at once (vmfork exec,
// each its own process) and returns their answers in order. It calls no
// t.Fatal: it runs goroutines.
func (e *env) shConcurrently(names []string, script func(name string) string) []ledgerAnswer {
	return e.embedded().shConcurrently(names, script)
}

func (d *driverEnv) shConcurrently(names []string, script func(name string) string) []ledgerAnswer {
	e := d.env
	out := make([]ledgerAnswer, len(names))
	var wg sync.WaitGroup
	for i, n := range names {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			args := append([]string{"--state-dir", e.stateDir, "--mem-dir", e.memDir}, d.args...)
			cmd := exec.CommandContext(ctx, e.bin, append(args, "exec", n, "--", "sh", "-c", script(n))...)
			var so, se strings.Builder
			cmd.Stdout, cmd.Stderr = &so, &se
			err := cmd.Run()
			a := ledgerAnswer{machine: n, out: strings.TrimSpace(so.String()), err: strings.TrimSpace(se.String())}
			if ee, ok := err.(*exec.ExitError); ok {
				a.code = ee.ExitCode()
			} else if err != nil {
				a.code, a.err = -1, err.Error()
			}
			out[i] = a
		}()
	}
	wg.Wait()
	return out
}

// atSecond is a guest shell prefix that waits until the guest's clock
// reaches unix second at: fork children's clocks are set from the host's
// (the identity chain's clock step), so machines started by separate
// vmfork exec processes act within a few ms of each other.
func atSecond(at int64) string {
	return fmt.Sprintf("while [ $(date +%%s) -lt %d ]; do usleep 5000; done; ", at)
}

type ledgerRecordJSON struct {
	Key    string `json:"key"`
	State  string `json:"state"`
	Holder string `json:"holder"`
	Result string `json:"result"`
}

func (e *env) ledgerRecords(name string) map[string]ledgerRecordJSON {
	e.t.Helper()
	return e.embedded().ledgerRecords(name)
}

func (d *driverEnv) ledgerRecords(name string) map[string]ledgerRecordJSON {
	d.t.Helper()
	var recs []ledgerRecordJSON
	d.cliJSON(&recs, "ledger", name)
	out := map[string]ledgerRecordJSON{}
	for _, r := range recs {
		out[r.Key] = r
	}
	return out
}

// Eight children of one fork claim pay-42 at the same instant: one is
// granted, seven are told it is taken by that one; a child forked later
// from a loser and the parent see it taken; a machine of another family is
// granted the same key. On both drivers.
func TestLedgerForkRace(t *testing.T) {
	parallel(t) // heavy and self-contained (tests/doc.go, "Parallel")
	for _, drv := range conformanceDrivers {
		t.Run(drv.name, func(t *testing.T) {
			ledgerRace(t, newDriverEnv(t, drv.args))
		})
	}
}

// ledgerRace is TestLedgerForkRace on driver env d.
func ledgerRace(t *testing.T, d *driverEnv) {
	web, other, late := d.n("web"), d.n("other"), d.n("late")
	d.bootGuest(web)
	d.withHelper(web)
	if a := d.ledger(web, "ping"); a.code != 0 || !strings.HasPrefix(a.out, "pong") {
		t.Fatalf("ledger port of a booted machine: %+v, want pong", a)
	}
	var fork forkJSON
	d.cliJSON(&fork, "fork", web, "--count", "8")
	var kids []string
	for _, c := range fork.Children {
		kids = append(kids, c.Name)
	}
	if len(kids) != 8 {
		t.Fatalf("fork: %d children, want 8: %+v", len(kids), fork)
	}
	at := time.Now().Add(6 * time.Second).Unix()
	answers := d.shConcurrently(kids, func(string) string { return atSecond(at) + guestHelper + " claim pay-42" })
	winner, taken := "", 0
	for _, a := range answers {
		switch {
		case a.code == 0 && a.out == "granted":
			if winner != "" {
				t.Errorf("pay-42 granted to %s and to %s", winner, a.machine)
			}
			winner = a.machine
		case a.code == 1 && strings.HasPrefix(a.out, "taken "):
			taken++
		default:
			t.Errorf("%s: claim pay-42: %+v, want granted or taken", a.machine, a)
		}
	}
	if winner == "" || taken != 7 {
		t.Fatalf("race of 8: winner %q, %d taken; want one winner and 7 taken: %+v", winner, taken, answers)
	}
	for _, a := range answers {
		if a.machine != winner && strings.Fields(a.out)[1] != winner {
			t.Errorf("%s was told %q, want taken by %s", a.machine, a.out, winner)
		}
	}
	loser := kids[0]
	if loser == winner {
		loser = kids[1]
	}
	d.cliOK("fork", loser, late)
	for _, m := range []string{late, web} {
		if a := d.ledger(m, "claim", "pay-42"); a.code != 1 || !strings.HasPrefix(a.out, "taken "+winner+" ") {
			t.Errorf("%s: claim pay-42: %+v, want taken by %s", m, a, winner)
		}
	}
	if r := d.ledgerRecords(web)["pay-42"]; r.State != "claimed" || r.Holder != winner {
		t.Errorf("vmfork ledger %s: pay-42 %+v, want claimed by %s", web, r, winner)
	}
	// Another family: another root, the same key.
	d.bootGuest(other)
	d.withHelper(other)
	if a := d.ledger(other, "claim", "pay-42"); a.code != 0 || a.out != "granted" {
		t.Errorf("other family: claim pay-42: %+v, want granted", a)
	}
	if a := d.ledger(winner, "done", "pay-42", "receipt-1"); a.code != 0 {
		t.Errorf("%s: done pay-42: %+v", winner, a)
	}
	if a := d.ledger(loser, "claim", "pay-42"); a.code != 1 || !strings.HasSuffix(a.out, " done receipt-1") {
		t.Errorf("%s after done: %+v, want taken ... done receipt-1", loser, a)
	}
}

// A machine rewound to a checkpoint from before its claim gets its own
// claim back (yours); an explore whose three tries each claim k ends with
// one claimant, and once its losers are removed their claims that are not
// done are released and their done ones stay.
func TestLedgerRewindAndExplore(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	e.stopReapersOnCleanup()
	e.boot("web")
	e.withHelper("web")
	e.ok("checkpoint", "web", "--as", "before")
	if a := e.ledger("web", "claim", "k"); a.code != 0 || a.out != "granted" {
		t.Fatalf("claim k: %+v, want granted", a)
	}
	e.ok("rewind", "web", "--to", "before")
	if a := e.ledger("web", "claim", "k"); a.code != 0 || !strings.HasPrefix(a.out, "yours ") {
		t.Errorf("claim k after a rewind to before the claim: %+v, want yours AT", a)
	}

	// Each try: its own key, a key it does, then the race for shared.
	try := func(i int) string {
		return fmt.Sprintf("%s claim own-%d >/dev/null; %s claim did-%d >/dev/null && %s done did-%d r%d >/dev/null; %s claim shared",
			guestHelper, i, guestHelper, i, guestHelper, i, i, guestHelper)
	}
	var res struct {
		Winner string `json:"winner"`
		Tries  []struct {
			Branch   string `json:"branch"`
			ExitCode int    `json:"exit_code"`
			Stdout   string `json:"stdout_tail"`
			Claims   []struct {
				Key   string `json:"key"`
				State string `json:"state"`
			} `json:"claims"`
			Released []string `json:"released"`
			Kept     bool     `json:"kept"`
		} `json:"tries"`
	}
	e.jsonOK(&res, "explore", "web", "--try", try(1), "--try", try(2), "--try", try(3), "--parallel", "3", "--try-timeout", "2m")
	recs := e.ledgerRecords("web")
	if r := recs["shared"]; r.State != "claimed" || r.Holder != res.Winner {
		t.Errorf("shared: %+v, want claimed by the winner %s", r, res.Winner)
	}
	granted := 0
	for i, tr := range res.Tries {
		own := fmt.Sprintf("own-%d", i+1)
		did := fmt.Sprintf("did-%d", i+1)
		if strings.TrimSpace(tr.Stdout) == "granted" {
			granted++
		}
		if r := recs[did]; r.State != "done" || r.Holder != tr.Branch {
			t.Errorf("try %d: %s is %+v, want done by %s", i+1, did, r, tr.Branch)
		}
		if tr.Branch == res.Winner {
			if r := recs[own]; r.State != "claimed" || len(tr.Released) != 0 {
				t.Errorf("winner %s: %s is %+v, released %v; want it claimed still", tr.Branch, own, r, tr.Released)
			}
			continue
		}
		if r := recs[own]; r.State != "released" || len(tr.Released) != 1 || tr.Released[0] != own {
			t.Errorf("loser %s: %s is %+v, released %v; want %s released", tr.Branch, own, r, tr.Released, own)
		}
		if len(tr.Claims) != 2 {
			t.Errorf("loser %s: claims %+v, want %s and %s", tr.Branch, tr.Claims, did, own)
		}
	}
	if granted != 1 {
		t.Errorf("%d tries were granted shared, want 1: %+v", granted, res.Tries)
	}
}

// A crash-matrix row for the ledger: the server is killed with SIGKILL in
// the middle of a burst of claims of the same keys by three machines.
// Until the next vmfork command that starts a machine starts another (which
// reconnects to every running machine), the guests' claims go unanswered;
// after it, no key has two holders: at most one machine was ever granted
// (or told yours of) each key, and the ledger names that machine.
func TestLedgerServerKilledDuringClaims(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	e := newEnv(t)
	e.boot("web")
	e.withHelper("web")
	e.ok("fork", "web", "--count", "2")
	machines := []string{"web", "web-1", "web-2"}
	const keys = 40
	at := time.Now().Add(5 * time.Second).Unix()
	done := make(chan []ledgerAnswer, 1)
	go func() {
		done <- e.shConcurrently(machines, func(string) string {
			// Each line: KEY EXIT ANSWER, the answer on one line (an
			// unanswered claim's message has more than one: echo $a
			// joins them). A short timeout: an unanswered claim gives
			// up and the burst goes on.
			return atSecond(at) + fmt.Sprintf("for i in $(seq 1 %d); do a=$(VMFORK_LEDGER_TIMEOUT=2 %s claim burst-$i 2>&1); c=$?; echo \"burst-$i $c\" $a; done", keys, guestHelper)
		})
	}()
	// Kill the server a moment into the burst.
	time.Sleep(time.Until(time.Unix(at, 0).Add(700 * time.Millisecond)))
	pid := e.ledgerServerPID()
	if pid == 0 {
		t.Fatal("no ledger server runs during the burst")
	}
	syscall.Kill(pid, syscall.SIGKILL)
	time.Sleep(2 * time.Second)
	// The next machine start brings a server back; it finds the others.
	e.ok("fork", "web", "late")
	answers := <-done
	holders := map[string]string{} // key -> the machine granted or told yours
	unanswered := 0
	for _, a := range answers {
		if a.code != 0 {
			t.Fatalf("%s: burst: %+v", a.machine, a)
		}
		for _, line := range strings.Split(a.out, "\n") {
			f := strings.Fields(line)
			if len(f) < 3 {
				t.Fatalf("%s: burst line %q", a.machine, line)
			}
			key, code := f[0], f[1]
			switch {
			case code == "0" && (f[2] == "granted" || f[2] == "yours"):
				if h, ok := holders[key]; ok && h != a.machine {
					t.Errorf("%s held by %s and by %s", key, h, a.machine)
				}
				holders[key] = a.machine
			case code == "1" && f[2] == "taken":
			case code == "2":
				unanswered++
			default:
				t.Errorf("%s: %s: unexpected %q", a.machine, key, line)
			}
		}
	}
	recs := e.ledgerRecords("web")
	for key, h := range holders {
		if r := recs[key]; r.Holder != h {
			t.Errorf("%s: the ledger says %+v, the guests %s", key, r, h)
		}
	}
	if len(holders) == 0 || e.ledgerServerPID() == 0 || e.ledgerServerPID() == pid {
		t.Errorf("%d keys held, server %d (killed %d): want claims granted and a new server", len(holders), e.ledgerServerPID(), pid)
	}
	t.Logf("%d keys held, %d claims unanswered while no server ran", len(holders), unanswered)
	// Every key claimed once answered is the ledger's, and every retry now
	// gets the same holder.
	for _, m := range machines {
		if a := e.ledger(m, "claim", "burst-1"); a.code == 2 {
			t.Errorf("%s: after the restart: %+v, want an answer", m, a)
		}
	}
}

// rawClaims is a guest script that claims n fresh keys PREFIX-1..n over
// the ledger port itself, one request line and one answer line at a time
// (the protocol with no process per claim, as a program would speak it),
// and prints "GRANTED SECONDS": the claims granted and the time they took
// by the guest's /proc/uptime (10 ms resolution).
func rawClaims(prefix string, n int) string {
	return fmt.Sprintf(`exec 3<>/dev/virtio-ports/org.vmfork.ledger.0
printf '\nping bench\n' >&3
while read -r l <&3; do [ "$l" = "pong bench" ] && break; done
t0=$(cut -d' ' -f1 /proc/uptime)
i=0; g=0
while [ $i -lt %d ]; do i=$((i+1)); echo "claim %s-$i" >&3; read -r a <&3; [ "$a" = granted ] && g=$((g+1)); done
t1=$(cut -d' ' -f1 /proc/uptime)
echo "$g $(echo "$t0 $t1" | awk '{print $2-$1}')"`, n, prefix)
}

// parseRaw reads rawClaims's output.
func parseRaw(b *testing.B, a ledgerAnswer) (granted int, secs float64) {
	b.Helper()
	if _, err := fmt.Sscan(a.out, &granted, &secs); err != nil || a.code != 0 {
		b.Fatalf("%s: raw claims: %+v (%v)", a.machine, a, err)
	}
	return granted, secs
}

// BenchmarkLedgerClaims measures the family ledger from real guests: the
// claims per second one guest gets over its port (a loop speaking the
// protocol: one request, one answer), the latency of one claim (the same
// loop's time per claim), one vmfork-ledger claim (the helper: a shell
// script and its processes, under TCG most of the cost), and the claims
// per second of 16 guests (one parent and 15 children) claiming at once.
// Each claim is of a fresh key: written and fdatasynced before its answer.
//
//	VMFORK_BIN=$PWD/bin/vmfork VMFORK_GUEST=/var/cache/vmfork/guest \
//	  go test -tags integration -run '^$' -bench BenchmarkLedgerClaims -benchtime 1x ./tests/
func BenchmarkLedgerClaims(b *testing.B) {
	e := newEnv(b)
	e.boot("web")
	e.withHelper("web")
	const one, each, helperN = 200, 100, 20
	// One guest, raw protocol. 200 fits the per-machine burst (bucket of
	// 200 at 500/s), so no request is refused busy.
	a := e.shConcurrently([]string{"web"}, func(string) string { return rawClaims("one", one) })[0]
	g1, s1 := parseRaw(b, a)
	if g1 != one {
		b.Fatalf("one guest: %d of %d claims granted", g1, one)
	}
	// One guest, the helper.
	h := e.shConcurrently([]string{"web"}, func(string) string {
		return fmt.Sprintf(`t0=$(cut -d' ' -f1 /proc/uptime); i=0; while [ $i -lt %d ]; do i=$((i+1)); %s claim helper-$i >/dev/null || exit 1; done; t1=$(cut -d' ' -f1 /proc/uptime); echo "%d $(echo "$t0 $t1" | awk '{print $2-$1}')"`, helperN, guestHelper, helperN)
	})[0]
	_, hs := parseRaw(b, h)
	// Sixteen guests at once, each its own keys.
	var fork forkJSON
	e.jsonOK(&fork, "fork", "web", "--count", "15")
	names := []string{"web"}
	for _, c := range fork.Children {
		names = append(names, c.Name)
	}
	at := time.Now().Add(8 * time.Second).Unix()
	all := e.shConcurrently(names, func(n string) string { return atSecond(at) + rawClaims("m-"+n, each) })
	total, longest := 0, 0.0
	for _, a := range all {
		g, s := parseRaw(b, a)
		total += g
		longest = max(longest, s)
	}
	b.ReportMetric(float64(one)/s1, "claims/s_1guest")
	b.ReportMetric(s1/float64(one)*1000, "ms/claim_1guest")
	b.ReportMetric(hs/float64(helperN)*1000, "ms/helper_claim")
	b.ReportMetric(float64(total)/longest, "claims/s_16guests")
	b.Logf("one guest: %d claims in %.2f s (%.0f/s, %.2f ms each); vmfork-ledger claim: %.0f ms each; %d guests: %d claims in %.2f s (%.0f/s)",
		one, s1, float64(one)/s1, s1/float64(one)*1000, hs/float64(helperN)*1000, len(names), total, longest, float64(total)/longest)
}
