package qmptest_test

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/vmfork/vmfork/qmp"
	"github.com/vmfork/vmfork/qmp/qmptest"
)

// recorder is a testing.TB that records failures and cleanups instead of acting on them, so a
// test can check what the fake reports.
type recorder struct {
	*testing.T
	mu       sync.Mutex
	errs     []string
	cleanups []func()
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

func (r *recorder) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.errs) > 0
}

func (r *recorder) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }

// finish runs the recorded cleanups, last first, and returns the recorded failures.
func (r *recorder) finish() []string {
	for _, f := range slices.Backward(r.cleanups) {
		f()
	}
	return r.errs
}

func TestFakeReports(t *testing.T) {
	tests := []struct {
		name   string
		script []qmptest.Step
		run    func(m *qmp.Monitor)
		want   string // substring of the one expected failure; empty for none
	}{
		{
			name:   "script followed",
			script: []qmptest.Step{qmptest.Expect("stop").WithArgs(nil), qmptest.Expect("cont")},
			run: func(m *qmp.Monitor) {
				m.Stop(t.Context())
				m.Cont(t.Context())
			},
		},
		{
			name:   "unexpected command",
			script: []qmptest.Step{qmptest.Expect("stop")},
			run:    func(m *qmp.Monitor) { m.Cont(t.Context()) },
			want:   `step 0: got command "cont", want "stop"`,
		},
		{
			name:   "command after the script",
			script: nil,
			run:    func(m *qmp.Monitor) { m.Stop(t.Context()) },
			want:   `unexpected command "stop" after the end of the script`,
		},
		{
			name:   "command never sent",
			script: []qmptest.Step{qmptest.Expect("stop"), qmptest.Expect("cont")},
			run:    func(m *qmp.Monitor) { m.Stop(t.Context()) },
			want:   `script not finished: step 1, command "cont", never arrived`,
		},
		{
			name:   "wrong arguments",
			script: []qmptest.Step{qmptest.Expect("migrate").WithArgs(map[string]string{"uri": "fd:mig"})},
			run:    func(m *qmp.Monitor) { m.Execute(t.Context(), "migrate", map[string]string{"uri": "exec:cat"}, nil) },
			want:   `got arguments {"uri":"exec:cat"}, want {"uri":"fd:mig"}`,
		},
		{
			name:   "no descriptor passed",
			script: []qmptest.Step{qmptest.Expect("getfd").ReceiveFD(func(*os.File) error { return nil })},
			run:    func(m *qmp.Monitor) { m.Execute(t.Context(), "getfd", map[string]string{"fdname": "x"}, nil) },
			want:   "no file descriptor was passed",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := &recorder{T: t}
			sock := qmptest.NewServer(rec, tt.script...)
			m, err := qmp.Dial(t.Context(), sock)
			if err != nil {
				t.Fatalf("Dial: %v", err)
			}
			tt.run(m)
			m.Close()
			errs := rec.finish()
			switch {
			case tt.want == "" && len(errs) > 0:
				t.Errorf("failures: got %q, want none", errs)
			case tt.want != "" && (len(errs) != 1 || !strings.Contains(errs[0], tt.want)):
				t.Errorf("failures: got %q, want one containing %q", errs, tt.want)
			}
		})
	}
}
