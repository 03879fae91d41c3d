package ledger

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// State is where a record stands.
type State string

// The states of a record. A key with no record has never been claimed.
const (
	// Claimed: granted to Holder, whose effect has not been reported done.
	Claimed State = "claimed"
	// Done: the holder reported the effect done; final for the guests.
	Done State = "done"
	// Released: given up (by its holder, an operator or a reaped explore
	// branch); the next claim of the key is granted to whoever asks.
	Released State = "released"
)

// Record is what a family's ledger knows of one key. Its JSON form is both
// the log's and the control socket's (and so what vmfork ledger --json
// prints): keys are snake_case and only grow.
type Record struct {
	Key    string `json:"key"`
	State  State  `json:"state"`
	Holder string `json:"holder"`
	// ClaimedAt is when Holder's claim was granted.
	ClaimedAt  time.Time `json:"claimed_at"`
	DoneAt     time.Time `json:"done_at,omitzero"`
	ReleasedAt time.Time `json:"released_at,omitzero"`
	// ReleasedBy is who released it: the holder's name, or ByOperator.
	ReleasedBy string `json:"released_by,omitempty"`
	// Result is what the holder reported with done (at most MaxResult bytes).
	Result string `json:"result,omitempty"`
}

// ByOperator is Record.ReleasedBy for a release made on the host (vmfork
// ledger --release, or a reaped explore branch), not by the holder. No
// machine can have this name.
const ByOperator = "@host"

// Bounds. Each is enforced where the input enters (the port, the control
// socket) and again by the Store; see the package doc.
const (
	// MaxKey is the longest key, in bytes.
	MaxKey = 200
	// MaxResult is the longest result, in bytes.
	MaxResult = 1024
	// MaxLine is the longest request line on a port, in bytes, without its
	// newline.
	MaxLine = 4096
	// MaxName is the longest machine name or family id.
	MaxName = 200
	// ListPage is the most records one `list` answer carries.
	ListPage = 1000
)

// Sentinel errors. The port turns each into its error line.
var (
	// ErrInvalid: a key, result, machine name or family id breaks a bound.
	ErrInvalid = errors.New("invalid")
	// ErrNotHolder: done or release by a machine that does not hold the key.
	ErrNotHolder = errors.New("not holder")
	// ErrNotClaimed: done or release of a key nobody holds.
	ErrNotClaimed = errors.New("not claimed")
	// ErrAlreadyDone: release of a key whose effect is done.
	ErrAlreadyDone = errors.New("already done")
	// ErrFull: the family has Limits.Records records or its log would pass
	// Limits.LogBytes.
	ErrFull = errors.New("family ledger full")
	// ErrStorage: the family's log could not be written or synced; nothing
	// was answered as done.
	ErrStorage = errors.New("ledger storage failed")
	// ErrCorrupt: a family's log is damaged before its tail (more than a
	// torn last write); it is left as it is for an operator.
	ErrCorrupt = errors.New("ledger log corrupt")
	// ErrNoServer: no ledger server answers on the control socket.
	ErrNoServer = errors.New("no ledger server")
	// ErrRunning: another ledger server already serves the directory.
	ErrRunning = errors.New("a ledger server already runs")
	// ErrNotFound: no such record or machine.
	ErrNotFound = errors.New("not found")
)

// HolderError is ErrNotHolder with the holder's name.
type HolderError struct{ Holder string }

func (e *HolderError) Error() string { return "not holder " + e.Holder }

// Is makes errors.Is(err, ErrNotHolder) true.
func (e *HolderError) Is(target error) bool { return target == ErrNotHolder }

// TimeFormat is how the port writes times: RFC 3339 in UTC with
// milliseconds, fixed width, so that times sort as text.
const TimeFormat = "2006-01-02T15:04:05.000Z"

func stamp(t time.Time) string { return t.UTC().Format(TimeFormat) }

// CheckKey checks a key: 1 to MaxKey bytes of UTF-8 with no space or
// control character, so that it is one word on a line.
func CheckKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("empty key: %w", ErrInvalid)
	case len(key) > MaxKey:
		return fmt.Errorf("key of %d bytes, over %d: %w", len(key), MaxKey, ErrInvalid)
	case !oneWord(key):
		return fmt.Errorf("key %q has a space, a control character or bad UTF-8: %w", key, ErrInvalid)
	}
	return nil
}

// CheckResult checks a result: at most MaxResult bytes of UTF-8 with no
// control character (spaces are fine: it is the rest of the line).
func CheckResult(r string) error {
	if len(r) > MaxResult {
		return fmt.Errorf("result of %d bytes, over %d: %w", len(r), MaxResult, ErrInvalid)
	}
	if !utf8.ValidString(r) || strings.IndexFunc(r, unicode.IsControl) >= 0 {
		return fmt.Errorf("result has a control character or bad UTF-8: %w", ErrInvalid)
	}
	return nil
}

// CheckName checks a machine name: 1 to MaxName bytes, one word.
func CheckName(name string) error {
	if name == "" || len(name) > MaxName || !oneWord(name) {
		return fmt.Errorf("machine name %q: want 1 to %d bytes with no space or control character: %w", name, MaxName, ErrInvalid)
	}
	return nil
}

// CheckFamily checks a family id. It names a directory, so it is held to
// letters, digits and . _ - (and is neither . nor ..).
func CheckFamily(id string) error {
	ok := id != "" && len(id) <= MaxName && id != "." && id != ".."
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			ok = false
			break
		}
	}
	if !ok {
		return fmt.Errorf("family id %q: want 1 to %d of [A-Za-z0-9._-]: %w", id, MaxName, ErrInvalid)
	}
	return nil
}

func oneWord(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	return strings.IndexFunc(s, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) < 0
}

func (r Record) check() error {
	if err := CheckKey(r.Key); err != nil {
		return err
	}
	if err := CheckName(r.Holder); err != nil {
		return err
	}
	if err := CheckResult(r.Result); err != nil {
		return err
	}
	switch r.State {
	case Claimed, Done, Released:
	default:
		return fmt.Errorf("record %q: state %q: %w", r.Key, r.State, ErrInvalid)
	}
	return nil
}

// Answer is the record as a `get` answers it, without the key:
// `claimed HOLDER AT`, `done HOLDER AT [RESULT]` or `released HOLDER AT`,
// AT being the time of that state (claim, done, release).
func (r Record) Answer() string {
	switch r.State {
	case Done:
		return joinResult("done "+r.Holder+" "+stamp(r.DoneAt), r.Result)
	case Released:
		return "released " + r.Holder + " " + stamp(r.ReleasedAt)
	}
	return "claimed " + r.Holder + " " + stamp(r.ClaimedAt)
}

func joinResult(s, result string) string {
	if result == "" {
		return s
	}
	return s + " " + result
}
