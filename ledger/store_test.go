package ledger

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func openTestStore(t *testing.T, dir string, lim Limits) *Store {
	t.Helper()
	st, err := OpenStore(dir, StoreOptions{Limits: lim})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func mustClaim(t *testing.T, st *Store, fam, machine, key string, want Outcome) Claim {
	t.Helper()
	c, err := st.Claim(fam, machine, key)
	if err != nil {
		t.Fatalf("claim %s by %s: %v", key, machine, err)
	}
	if c.Outcome != want {
		t.Fatalf("claim %s by %s: got %s, want %s", key, machine, c.Line(), want)
	}
	return c
}

func TestStoreClaimDoneRelease(t *testing.T) {
	st := openTestStore(t, t.TempDir(), Limits{})
	mustClaim(t, st, "f1", "a", "pay-42", Granted)
	c := mustClaim(t, st, "f1", "b", "pay-42", Taken)
	if c.Record.Holder != "a" || !strings.HasPrefix(c.Line(), "taken a ") {
		t.Fatalf("got %q, want taken a AT", c.Line())
	}
	// The holder asking again (rewound, or its answer lost) gets its own
	// claim back, with the original time.
	own := mustClaim(t, st, "f1", "a", "pay-42", Yours)
	if got, want := own.Line(), "yours "+stamp(own.Record.ClaimedAt); got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	// Another family never sees it.
	mustClaim(t, st, "f2", "z", "pay-42", Granted)

	if _, err := st.Done("f1", "b", "pay-42", "x"); !errors.Is(err, ErrNotHolder) {
		t.Fatalf("done by b: got %v, want ErrNotHolder", err)
	}
	if _, err := st.Done("f1", "a", "pay-42", "receipt 7"); err != nil {
		t.Fatal(err)
	}
	r, _ := st.Done("f1", "a", "pay-42", "other")
	if r.Result != "receipt 7" {
		t.Fatalf("done again: result %q, want the first one kept", r.Result)
	}
	if got := mustClaim(t, st, "f1", "b", "pay-42", Taken).Line(); !strings.HasSuffix(got, " done receipt 7") {
		t.Fatalf("got %q, want taken a AT done receipt 7", got)
	}
	if got := mustClaim(t, st, "f1", "a", "pay-42", Yours).Line(); !strings.HasSuffix(got, " done receipt 7") {
		t.Fatalf("got %q, want yours AT done receipt 7", got)
	}
	if _, err := st.ReleaseOwn("f1", "a", "pay-42"); !errors.Is(err, ErrAlreadyDone) {
		t.Fatalf("release of a done key: got %v, want ErrAlreadyDone", err)
	}

	mustClaim(t, st, "f1", "b", "job", Granted)
	if _, err := st.ReleaseOwn("f1", "a", "job"); !errors.Is(err, ErrNotHolder) {
		t.Fatalf("release by a: got %v, want ErrNotHolder", err)
	}
	if _, err := st.ReleaseOwn("f1", "b", "job"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.ReleaseOwn("f1", "b", "job"); !errors.Is(err, ErrNotClaimed) {
		t.Fatalf("second release: got %v, want ErrNotClaimed", err)
	}
	r, err := st.Get("f1", "job")
	if err != nil || r.State != Released || r.ReleasedBy != "b" {
		t.Fatalf("get job: got %+v, %v; want released by b", r, err)
	}
	mustClaim(t, st, "f1", "a", "job", Granted) // a released key goes to whoever asks
	if _, err := st.Get("f1", "nosuch"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("get nosuch: got %v, want ErrNotFound", err)
	}
	// The operator releases anything, done included.
	r, err = st.Release("f1", "pay-42")
	if err != nil || r.ReleasedBy != ByOperator {
		t.Fatalf("operator release: got %+v, %v", r, err)
	}
	mustClaim(t, st, "f1", "b", "pay-42", Granted)
}

func TestStoreReleaseHeldByAndKeysOf(t *testing.T) {
	st := openTestStore(t, t.TempDir(), Limits{})
	for _, k := range []string{"k1", "k2", "k3"} {
		mustClaim(t, st, "f", "loser", k, Granted)
	}
	mustClaim(t, st, "f", "winner", "k4", Granted)
	if _, err := st.Done("f", "loser", "k2", "sent"); err != nil {
		t.Fatal(err)
	}
	keys, err := st.KeysOf("f", "loser")
	if err != nil || len(keys) != 3 {
		t.Fatalf("keys of loser: got %v, %v; want k1 k2 k3", keys, err)
	}
	rel, err := st.ReleaseHeldBy("f", "loser")
	if err != nil {
		t.Fatal(err)
	}
	if len(rel) != 2 || rel[0].Key != "k1" || rel[1].Key != "k3" {
		t.Fatalf("released %v, want k1 and k3 (k2 is done and stays)", rel)
	}
	for k, want := range map[string]State{"k1": Released, "k2": Done, "k3": Released, "k4": Claimed} {
		if r, _ := st.Get("f", k); r.State != want {
			t.Errorf("%s: got %s, want %s", k, r.State, want)
		}
	}
	mustClaim(t, st, "f", "winner", "k1", Granted)
}

// TestStoreRace: 8 machines of one family claim the same key at once:
// exactly one is granted, and the seven others are told its name.
func TestStoreRace(t *testing.T) {
	st := openTestStore(t, t.TempDir(), Limits{})
	for round := range 20 {
		key := fmt.Sprintf("pay-%d", round)
		var wg sync.WaitGroup
		claims := make([]Claim, 8)
		errs := make([]error, 8)
		for i := range 8 {
			wg.Go(func() { claims[i], errs[i] = st.Claim("fam", fmt.Sprintf("child-%d", i), key) })
		}
		wg.Wait()
		holder := ""
		for i, c := range claims {
			if errs[i] != nil {
				t.Fatal(errs[i])
			}
			if c.Outcome == Granted {
				if holder != "" {
					t.Fatalf("%s granted to %s and child-%d", key, holder, i)
				}
				holder = fmt.Sprintf("child-%d", i)
			}
		}
		if holder == "" {
			t.Fatalf("%s granted to nobody", key)
		}
		for i, c := range claims {
			if c.Outcome == Taken && c.Record.Holder != holder {
				t.Fatalf("child-%d: got %q, want taken %s", i, c.Line(), holder)
			}
		}
		mustClaim(t, st, "other-family", "stranger", key, Granted)
	}
}

func TestStoreDurableAndTornTail(t *testing.T) {
	dir := t.TempDir()
	st, err := OpenStore(dir, StoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		mustClaim(t, st, "f", "a", fmt.Sprintf("k%d", i), Granted)
	}
	st.Done("f", "a", "k3", "with spaces \"and\" quotes \\ é")
	// No Close: a crash. The log is whole.
	logPath := filepath.Join(dir, dirFamilies, "f", fileLog)
	whole, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	st.Close()

	// A crash in the middle of the next append: the line is cut anywhere.
	extra, _ := encodeLine(Record{Key: "k10", State: Claimed, Holder: "b", ClaimedAt: time.Now().UTC()})
	for _, cut := range []int{1, 9, len(extra) / 2, len(extra) - 1} {
		os.WriteFile(logPath, append(append([]byte{}, whole...), extra[:cut]...), 0o600)
		st2 := openTestStore(t, dir, Limits{})
		recs, err := st2.List("f")
		if err != nil {
			t.Fatalf("cut at %d: %v", cut, err)
		}
		if len(recs) != 10 {
			t.Fatalf("cut at %d: got %d records, want 10", cut, len(recs))
		}
		if r, _ := st2.Get("f", "k3"); r.Result != "with spaces \"and\" quotes \\ é" {
			t.Fatalf("k3's result: got %q", r.Result)
		}
		// The torn record was never answered: its key is free.
		mustClaim(t, st2, "f", "c", "k10", Granted)
		st2.Close()
		if got, _ := os.ReadFile(logPath); !strings.HasPrefix(string(got), string(whole)) {
			t.Fatalf("cut at %d: the good prefix changed", cut)
		}
	}

	// A crash that left zeros (blocks allocated, data not written).
	os.WriteFile(logPath, append(append([]byte{}, whole...), make([]byte, 8192)...), 0o600)
	st3 := openTestStore(t, dir, Limits{})
	if recs, err := st3.List("f"); err != nil || len(recs) != 10 {
		t.Fatalf("zero tail: got %d records, %v", len(recs), err)
	}
	st3.Close()

	// A bad CRC far from the end is damage to answered records, not a torn
	// write: refused, and the file left alone.
	big := append([]byte{}, whole...)
	for len(big) < tornLimit+len(whole) {
		big = append(big, whole[len(whole)-len(extra):]...)
	}
	hdrLen := strings.IndexByte(string(whole), '\n') + 1
	big[hdrLen+3] ^= 1
	os.WriteFile(logPath, big, 0o600)
	st4 := openTestStore(t, dir, Limits{})
	if _, err := st4.List("f"); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("damaged log: got %v, want ErrCorrupt", err)
	}
	if got, _ := os.ReadFile(logPath); len(got) != len(big) {
		t.Fatal("a corrupt log was changed")
	}
}

func TestStoreFamilyHeaderChecked(t *testing.T) {
	dir := t.TempDir()
	st := openTestStore(t, dir, Limits{})
	mustClaim(t, st, "f1", "a", "k", Granted)
	st.Close()
	// f1's log copied into f2's place is not f2's ledger.
	os.MkdirAll(filepath.Join(dir, dirFamilies, "f2"), 0o700)
	js, _ := os.ReadFile(filepath.Join(dir, dirFamilies, "f1", fileLog))
	os.WriteFile(filepath.Join(dir, dirFamilies, "f2", fileLog), js, 0o600)
	st2 := openTestStore(t, dir, Limits{})
	if _, err := st2.List("f2"); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("got %v, want ErrCorrupt", err)
	}
	for _, bad := range []string{"", ".", "..", "a/b", "../x", "a b", strings.Repeat("x", MaxName+1)} {
		if _, err := st2.Claim(bad, "m", "k"); !errors.Is(err, ErrInvalid) {
			t.Errorf("family %q: got %v, want ErrInvalid", bad, err)
		}
	}
}

func TestStoreLimits(t *testing.T) {
	st := openTestStore(t, t.TempDir(), Limits{Records: 5})
	for i := range 5 {
		mustClaim(t, st, "f", "a", fmt.Sprintf("k%d", i), Granted)
	}
	if _, err := st.Claim("f", "a", "k5"); !errors.Is(err, ErrFull) {
		t.Fatalf("6th key: got %v, want ErrFull", err)
	}
	// Existing keys still work, and a release frees nothing (records stay).
	mustClaim(t, st, "f", "b", "k0", Taken)
	if _, err := st.Done("f", "a", "k0", "r"); err != nil {
		t.Fatal(err)
	}

	st2 := openTestStore(t, t.TempDir(), Limits{LogBytes: 64 << 10})
	res := strings.Repeat("r", MaxResult)
	var full error
	n := 0
	for ; n < 1000 && full == nil; n++ {
		k := fmt.Sprintf("key-%d", n)
		if _, full = st2.Claim("f", "a", k); full == nil {
			_, full = st2.Done("f", "a", k, res)
		}
	}
	if !errors.Is(full, ErrFull) || n > 40 {
		t.Fatalf("after %d keys: got %v, want ErrFull within 32 KiB of records", n, full)
	}
	st2.Close()
	for _, bad := range []struct{ key, result string }{
		{strings.Repeat("k", MaxKey+1), ""}, {"a b", ""}, {"a\tb", ""}, {"", ""}, {"\xff", ""},
		{"k", strings.Repeat("r", MaxResult+1)}, {"k", "two\nlines"}, {"k", "\xff"},
	} {
		if _, err := st.Done("f", "a", bad.key, bad.result); !errors.Is(err, ErrInvalid) {
			t.Errorf("key %q result %q: got %v, want ErrInvalid", bad.key, bad.result, err)
		}
	}
}

// TestStoreCompaction: churn on a few keys keeps the log near the size of
// its live records, and every record survives.
func TestStoreCompaction(t *testing.T) {
	dir := t.TempDir()
	st := openTestStore(t, dir, Limits{LogBytes: 8 << 20})
	res := strings.Repeat("r", MaxResult)
	for i := range 600 { // about 1.5 MiB of entries, over compactMin
		k := fmt.Sprintf("k%d", i%10)
		if _, err := st.Claim("f", "a", k); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Done("f", "a", k, res); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Release("f", k); err != nil {
			t.Fatal(err)
		}
	}
	mustClaim(t, st, "f", "a", "last", Granted)
	fi, err := os.Stat(filepath.Join(dir, dirFamilies, "f", fileLog))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > compactMin {
		t.Fatalf("log is %d bytes after 1800 changes to 11 keys; want it compacted", fi.Size())
	}
	st.Close()
	st2 := openTestStore(t, dir, Limits{})
	recs, err := st2.List("f")
	if err != nil || len(recs) != 11 {
		t.Fatalf("after compaction: %d records, %v; want 11", len(recs), err)
	}
	if recs[0].Result != res || recs[0].State != Released {
		t.Fatalf("k0 after compaction: %+v", recs[0])
	}
	mustClaim(t, st2, "f", "b", "last", Taken)
}

func TestStorePage(t *testing.T) {
	st := openTestStore(t, t.TempDir(), Limits{})
	for i := range 25 {
		mustClaim(t, st, "f", "a", fmt.Sprintf("k%02d", i), Granted)
	}
	var got []string
	after := ""
	for {
		recs, more, err := st.Page("f", after, 10)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			got = append(got, r.Key)
		}
		if !more {
			break
		}
		after = recs[len(recs)-1].Key
	}
	if len(got) != 25 || got[0] != "k00" || got[24] != "k24" {
		t.Fatalf("pages: %v", got)
	}
}
