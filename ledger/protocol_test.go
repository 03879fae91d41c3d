package ledger

import (
	"bytes"
	"fmt"
	"io"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
)

func testSession(st *Store, family, machine string, r Rate) *session {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return &session{store: st, family: family, machine: machine, bucket: newBucket(r), now: time.Now, log: logrus.NewEntry(l)}
}

// converse feeds in to a session and returns its answer lines.
func converse(t *testing.T, s *session, in string) []string {
	t.Helper()
	var out bytes.Buffer
	if err := s.serve(struct {
		io.Reader
		io.Writer
	}{strings.NewReader(in), &out}); err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
}

var fast = Rate{PerSecond: 1e6, Burst: 1e6}

const at = `\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z`

// TestProtocol is the port's protocol, request by request, bad input
// included: every line gets exactly one answer (list: its header and
// lines), and a bad one records nothing.
func TestProtocol(t *testing.T) {
	st := openTestStore(t, t.TempDir(), Limits{})
	a := testSession(st, "fam", "alpha", fast)
	b := testSession(st, "fam", "beta", fast)
	other := testSession(st, "elsewhere", "gamma", fast)
	long := strings.Repeat("k", MaxKey)
	cases := []struct {
		s        *session
		req, ans string // ans is a regexp
	}{
		{a, "ping", "pong"},
		{a, "ping tok-1", "pong tok-1"},
		{a, "get pay-42", "none"},
		{a, "claim pay-42", "granted"},
		{b, "claim pay-42", "taken alpha " + at},
		{a, "claim pay-42", "yours " + at},
		{other, "claim pay-42", "granted"},
		{a, "get pay-42", "claimed alpha " + at},
		{b, "done pay-42 x", "error not holder alpha"},
		{b, "release pay-42", "error not holder alpha"},
		{a, "done pay-42 receipt 123  two spaces", "ok"},
		{a, "get pay-42", "done alpha " + at + " receipt 123  two spaces"},
		{b, "claim pay-42", "taken alpha " + at + " done receipt 123  two spaces"},
		{a, "claim pay-42", "yours " + at + " done receipt 123  two spaces"},
		{a, "release pay-42", "error already done"},
		{a, "done nosuch", "error not claimed"},
		{a, "release nosuch", "error not claimed"},
		{b, "claim job", "granted"},
		{b, "done job", "ok"},
		{a, "claim job", "taken beta " + at + " done"},
		{b, "claim tmp", "granted"},
		{b, "release tmp", "ok"},
		{a, "get tmp", "released beta " + at},
		{a, "claim tmp", "granted"},
		{a, "claim " + long, "granted"},
		{a, "claim é-ünïcode", "granted"},
		{a, "claim x\r", "granted"}, // CRLF line ends are fine
		// Bad input: one error line each, nothing recorded.
		{a, "", "error empty request"},
		{a, "CLAIM k", "error unknown verb"},
		{a, "fly away", "error unknown verb"},
		{a, "claim", "error missing key"},
		{a, "claim ", "error missing key"},
		{a, "done", "error missing key"},
		{a, "get", "error missing key"},
		{a, "release", "error missing key"},
		{a, "claim a b", "error too many arguments"},
		{a, "claim  a", "error too many arguments"},
		{a, "claim " + long + "k", "error key too long"},
		{a, "claim a\tb", "error bad key"},
		{a, "claim \x01", "error bad key"},
		{a, "claim \xff\xfe", "error bad key"},
		{a, "claim a\u00a0b", "error bad key"},
		{a, "done pay-42 " + strings.Repeat("r", MaxResult+1), "error result too long"},
		{a, "done pay-42 bell\x07", "error bad result"},
		{a, "list a b", "error too many arguments"},
		{a, "ping a b", "error too many arguments"},
		{a, strings.Repeat("x", MaxLine+1), "error line too long"},
		{a, "claim " + strings.Repeat("y", 10*MaxLine), "error line too long"},
		{a, "get a b", "error too many arguments"},
	}
	for _, c := range cases {
		got := converse(t, c.s, c.req+"\n")
		if len(got) != 1 || !regexp.MustCompile("^"+c.ans+"$").MatchString(got[0]) {
			t.Errorf("%s: %.60q: got %q, want %s", c.s.machine, c.req, got, c.ans)
		}
	}
	recs, _ := st.List("fam")
	if len(recs) != 6 {
		t.Errorf("records: got %d, want 6 (pay-42 job tmp long é x)", len(recs))
	}
	for _, r := range recs {
		if r.Key == "a" || strings.HasPrefix(r.Key, "a") || r.Key == "k" {
			t.Errorf("a bad request recorded %q", r.Key)
		}
	}

	// list: a header with the count, one line per record ("KEY " and what
	// get answers), sorted by key; more pages follow `list LASTKEY`.
	got := converse(t, a, "list\n")
	if got[0] != "list 6" || len(got) != 7 || !regexp.MustCompile("^job done beta "+at+"$").MatchString(got[1]) {
		t.Errorf("list: got %q", got)
	}
	if got := converse(t, a, "list pay-42\n"); len(got) != 4 || got[0] != "list 3" || !strings.HasPrefix(got[1], "tmp ") {
		t.Errorf("list after pay-42: got %q", got)
	}
}

func TestProtocolListPages(t *testing.T) {
	st := openTestStore(t, t.TempDir(), Limits{})
	s := testSession(st, "f", "m", fast)
	var req strings.Builder
	for i := range ListPage + 5 {
		fmt.Fprintf(&req, "claim k%04d\n", i)
	}
	converse(t, s, req.String())
	got := converse(t, s, "list\n")
	if got[0] != fmt.Sprintf("list %d more", ListPage) || len(got) != ListPage+1 {
		t.Fatalf("first page: header %q, %d lines", got[0], len(got))
	}
	last, _, _ := strings.Cut(got[len(got)-1], " ")
	got = converse(t, s, "list "+last+"\n")
	if got[0] != "list 5" || len(got) != 6 || !strings.HasPrefix(got[5], "k1004 claimed m ") {
		t.Fatalf("second page: %q", got)
	}
}

// TestProtocolPipelined: requests sent ahead of their answers are
// answered in order.
func TestProtocolPipelined(t *testing.T) {
	st := openTestStore(t, t.TempDir(), Limits{})
	s := testSession(st, "f", "m", fast)
	got := converse(t, s, "claim a\nbogus\nclaim a\nget a\nping z\n")
	want := []string{"granted", "error unknown verb", "yours", "claimed m", "pong z"}
	for i, w := range want {
		if !strings.HasPrefix(got[i], w) {
			t.Fatalf("answer %d: got %q, want %s", i, got[i], w)
		}
	}
}

// TestProtocolFlood: a machine sending faster than its rate gets `error
// busy` lines and records nothing more; memory stays bounded whatever it
// sends, an endless line included.
func TestProtocolFlood(t *testing.T) {
	st := openTestStore(t, t.TempDir(), Limits{})
	s := testSession(st, "f", "flooder", Rate{PerSecond: 1, Burst: 10})
	var req strings.Builder
	for i := range 1000 {
		fmt.Fprintf(&req, "claim flood-%d\n", i)
	}
	got := converse(t, s, req.String())
	granted, busy := 0, 0
	for _, l := range got {
		switch l {
		case "granted":
			granted++
		case "error busy":
			busy++
		default:
			t.Fatalf("unexpected answer %q", l)
		}
	}
	if granted > 11 || granted+busy != 1000 {
		t.Fatalf("got %d granted and %d busy of 1000, want at most 11 granted (burst 10, 1/s)", granted, busy)
	}
	if recs, _ := st.List("f"); len(recs) != granted {
		t.Fatalf("records: got %d, want %d", len(recs), granted)
	}

	// 64 MiB with no newline, then a good line: one error, then the answer,
	// and the session allocated a few KiB, not the line.
	s2 := testSession(st, "f", "flooder2", fast)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	in := io.MultiReader(&repeatReader{b: 'x', n: 64 << 20}, strings.NewReader("\nping ok\n"))
	var out bytes.Buffer
	if err := s2.serve(struct {
		io.Reader
		io.Writer
	}{in, &out}); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if out.String() != "error line too long\npong ok\n" {
		t.Fatalf("got %q", out.String())
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
		t.Fatalf("serving a 64 MiB line allocated %d bytes", grew)
	}
}

type repeatReader struct {
	b byte
	n int
}

func (r *repeatReader) Read(p []byte) (int, error) {
	if r.n == 0 {
		return 0, io.EOF
	}
	n := min(len(p), r.n)
	for i := range n {
		p[i] = r.b
	}
	r.n -= n
	return n, nil
}
