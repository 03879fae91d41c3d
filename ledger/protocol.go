package ledger

import (
	"bufio"
	"errors"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
)

// Rate bounds how fast one machine's requests are served: a token bucket
// that holds Burst tokens and gains PerSecond a second; each request line
// (good or bad) takes one, and a line that finds none is answered `error
// busy` and does nothing else.
type Rate struct {
	PerSecond float64
	Burst     int
}

// DefaultRate is a machine's rate unless ServerOptions.Rate says otherwise.
var DefaultRate = Rate{PerSecond: 500, Burst: 200}

type bucket struct {
	rate, burst, tokens float64
	last                time.Time
}

func newBucket(r Rate) *bucket {
	if r.PerSecond <= 0 || r.Burst <= 0 {
		r = DefaultRate
	}
	return &bucket{rate: r.PerSecond, burst: float64(r.Burst), tokens: float64(r.Burst)}
}

func (b *bucket) take(now time.Time) bool {
	if !b.last.IsZero() {
		b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	}
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// session serves one machine's stream: its family and name come from the
// host's registration, never from what the guest writes.
type session struct {
	store   *Store
	family  string
	machine string
	bucket  *bucket
	now     func() time.Time
	log     *logrus.Entry
}

var errLineTooLong = errors.New("line too long")

// readLine returns the next request line without its newline (and a CR
// before it). A line over MaxLine is read up to its newline and dropped
// (errLineTooLong), so the stream goes on at the next line; a last line
// with no newline is dropped with the stream's end.
func readLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		for errors.Is(err, bufio.ErrBufferFull) {
			_, err = br.ReadSlice('\n')
		}
		if err != nil {
			return nil, err
		}
		return nil, errLineTooLong
	}
	if err != nil {
		return nil, err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	if len(line) > MaxLine {
		return nil, errLineTooLong
	}
	return line, nil
}

// serve answers requests on rw, one answer per request and in order,
// until rw fails or ends; it returns that error (nil at a clean end).
// Memory is bounded whatever the guest sends: one line buffer, one
// answer, one page of a list.
func (s *session) serve(rw io.ReadWriter) error {
	br := bufio.NewReaderSize(rw, MaxLine+2)
	bw := bufio.NewWriterSize(rw, 4096)
	for {
		line, err := readLine(br)
		switch {
		case errors.Is(err, errLineTooLong):
			s.reply(bw, "error line too long")
		case errors.Is(err, io.EOF):
			return nil
		case err != nil:
			return err
		default:
			s.handle(bw, string(line))
		}
		// Answers to requests sent ahead of their predecessors' answers go
		// out together.
		if br.Buffered() == 0 {
			if err := bw.Flush(); err != nil {
				return err
			}
		}
	}
}

func (s *session) reply(bw *bufio.Writer, line string) {
	bw.WriteString(line)
	bw.WriteByte('\n')
}

// handle answers one request line (see the package doc for the protocol).
func (s *session) handle(bw *bufio.Writer, line string) {
	if !s.bucket.take(s.now()) {
		s.reply(bw, "error busy")
		return
	}
	verb, rest, _ := strings.Cut(line, " ")
	answer := s.answer(bw, verb, rest)
	if answer != "" {
		s.reply(bw, answer)
	}
	if s.log.Logger.IsLevelEnabled(logrus.DebugLevel) {
		s.log.WithFields(logrus.Fields{"verb": firstWord(verb), "answer": firstWord(answer)}).Debug("ledger request")
	}
}

// answer returns the answer line; list writes its own lines and returns "".
func (s *session) answer(bw *bufio.Writer, verb, rest string) string {
	switch verb {
	case "":
		return "error empty request"
	case "claim", "get", "release":
		key, msg := keyArg(rest, false)
		if msg != "" {
			return msg
		}
		return s.keyVerb(verb, key)
	case "done":
		key, result, _ := strings.Cut(rest, " ")
		if _, msg := keyArg(key, false); msg != "" {
			return msg
		}
		if len(result) > MaxResult {
			return "error result too long"
		}
		if CheckResult(result) != nil {
			return "error bad result"
		}
		if _, err := s.store.Done(s.family, s.machine, key, result); err != nil {
			return s.errorLine(err)
		}
		return "ok"
	case "list":
		after, msg := keyArg(rest, true)
		if msg != "" {
			return msg
		}
		recs, more, err := s.store.Page(s.family, after, ListPage)
		if err != nil {
			return s.errorLine(err)
		}
		head := "list " + strconv.Itoa(len(recs))
		if more {
			head += " more"
		}
		s.reply(bw, head)
		for _, r := range recs {
			s.reply(bw, r.Key+" "+r.Answer())
		}
		return ""
	case "ping":
		tok, msg := keyArg(rest, true)
		if msg != "" {
			return msg
		}
		return strings.TrimSuffix("pong "+tok, " ")
	}
	return "error unknown verb"
}

func (s *session) keyVerb(verb, key string) string {
	switch verb {
	case "claim":
		c, err := s.store.Claim(s.family, s.machine, key)
		if err != nil {
			return s.errorLine(err)
		}
		return c.Line()
	case "get":
		r, err := s.store.Get(s.family, key)
		if errors.Is(err, ErrNotFound) {
			return "none"
		}
		if err != nil {
			return s.errorLine(err)
		}
		return r.Answer()
	}
	if _, err := s.store.ReleaseOwn(s.family, s.machine, key); err != nil {
		return s.errorLine(err)
	}
	return "ok"
}

// keyArg checks a verb's one argument: a key (or, when optional, nothing).
// It returns the key, or the error line.
func keyArg(rest string, optional bool) (string, string) {
	switch {
	case rest == "" && optional:
		return "", ""
	case rest == "":
		return "", "error missing key"
	case strings.Contains(rest, " "):
		return "", "error too many arguments"
	case len(rest) > MaxKey:
		return "", "error key too long"
	case CheckKey(rest) != nil:
		return "", "error bad key"
	}
	return rest, ""
}

func (s *session) errorLine(err error) string {
	var he *HolderError
	switch {
	case errors.As(err, &he):
		return "error not holder " + he.Holder
	case errors.Is(err, ErrNotClaimed):
		return "error not claimed"
	case errors.Is(err, ErrAlreadyDone):
		return "error already done"
	case errors.Is(err, ErrFull):
		return "error full"
	case errors.Is(err, errClosed):
		return "error unavailable"
	}
	s.log.WithError(err).Warn("ledger request failed")
	return "error storage"
}

// firstWord is what a debug log keeps of a guest's line: its verb or
// answer word, never its key or result.
func firstWord(s string) string {
	w, _, _ := strings.Cut(s, " ")
	if len(w) > 16 || !oneWord(w) {
		return "?"
	}
	return w
}
