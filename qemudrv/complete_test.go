package qemudrv

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/qemustate"
	"github.com/vmfork/vmfork/qmp"
	"github.com/vmfork/vmfork/qmp/qmptest"
)

// fakeTemplate is a template whose device-state file exists.
func fakeTemplate(t *testing.T) *vmfork.Template {
	dir := t.TempDir()
	tpl := &vmfork.Template{
		ID: "web.1", Source: "web", Driver: Name, HasMemory: true,
		Paths: vmfork.TemplatePaths{
			Dir: dir, DevState: filepath.Join(dir, "devstate"), RAM: filepath.Join(dir, "web.1"+ramSuffix),
		},
	}
	if err := os.WriteFile(tpl.Paths.DevState, []byte("QEVM"), 0o600); err != nil {
		t.Fatal(err)
	}
	return tpl
}

// loadSteps is the device-state load up to its first query-migrate, the
// backend's link down first (the RARP QEMU sends at the load's end).
func loadSteps() []qmptest.Step {
	return []qmptest.Step{
		qmptest.Expect("set_link").WithArgs(map[string]any{"name": netdevID, "up": false}),
		qmptest.Expect("getfd").WithArgs(map[string]string{"fdname": devStateFD}).ReceiveFD(func(*os.File) error { return nil }),
		qmptest.Expect("migrate-incoming").WithArgs(map[string]string{"uri": "fd:" + devStateFD}),
	}
}

func TestComplete(t *testing.T) {
	q := newFakeQEMU()
	sock := qmptest.NewServer(t, append(loadSteps(),
		qmptest.Expect("query-migrate").Return(map[string]any{"status": "completed"}),
		// The backend's link and with it the NIC's (the load set it to
		// the source's) down: they stay down until the identity chain has
		// run.
		qmptest.Expect("set_link").WithArgs(map[string]any{"name": netdevID, "up": false}),
		qmptest.Expect("cont"),
	)...)
	d := testDriver(t, q)
	if err := d.Complete(t.Context(), fakeMachine(t, "web-1", sock, ""), fakeTemplate(t)); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if got := q.signals(); len(got) != 0 {
		t.Errorf("signals sent: got %v, want none", got)
	}
}

// Every way Complete fails leaves no process of the child: a QEMU that is
// still there is killed, one that exited is not signalled (its PID may be
// another process's by now), and the error says which step failed and why.
// A child without a network has no backend: only its NIC's link is set.
func TestCompleteNoNetwork(t *testing.T) {
	q := newFakeQEMU()
	sock := qmptest.NewServer(t,
		qmptest.Expect("getfd").WithArgs(map[string]string{"fdname": devStateFD}).ReceiveFD(func(*os.File) error { return nil }),
		qmptest.Expect("migrate-incoming").WithArgs(map[string]string{"uri": "fd:" + devStateFD}),
		qmptest.Expect("query-migrate").Return(map[string]any{"status": "completed"}),
		qmptest.Expect("set_link").WithArgs(map[string]any{"name": nicID, "up": false}),
		qmptest.Expect("cont"),
	)
	m := fakeMachine(t, "web-1", sock, "")
	m.Spec.Network = vmfork.Network{Kind: vmfork.NetworkNone}
	if err := testDriver(t, q).Complete(t.Context(), m, fakeTemplate(t)); err != nil {
		t.Fatalf("Complete: %v", err)
	}
}

func TestCompleteFailure(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps func(q *fakeQEMU) []qmptest.Step
		// log is QEMU's log; the error of a QEMU that exited quotes it.
		log      string
		wantSigs []syscall.Signal
		wantIs   error
		wantErr  []string
	}{{
		name: "load fails",
		steps: func(*fakeQEMU) []qmptest.Step {
			return append(loadSteps(), qmptest.Expect("query-migrate").Return(map[string]any{
				"status": "failed", "error-desc": "Unable to read from socket",
			}))
		},
		wantSigs: []syscall.Signal{syscall.SIGKILL},
		wantIs:   qemustate.ErrMigrationFailed,
		wantErr:  []string{"load device state", "Unable to read from socket"},
	}, {
		name: "QEMU exits during the load",
		steps: func(q *fakeQEMU) []qmptest.Step {
			return append(loadSteps(),
				qmptest.Expect("query-migrate").CheckArgs(func(json.RawMessage) error { q.exit(); return nil }).NoReply(),
				qmptest.Disconnect())
		},
		log:     "# 2026-01-01T00:00:00Z qemu-system-x86_64 ...\nqemu-system-x86_64: Unknown savevm section or instance 'virtio-net' 0\nqemu-system-x86_64: load of migration failed: Invalid argument\n",
		wantErr: []string{"load device state", "QEMU exited", "load of migration failed: Invalid argument"},
	}, {
		name: "QMP connection dropped mid-load",
		steps: func(*fakeQEMU) []qmptest.Step {
			return append(loadSteps(), qmptest.Expect("query-migrate").NoReply(), qmptest.Disconnect())
		},
		wantSigs: []syscall.Signal{syscall.SIGKILL},
		wantIs:   qmp.ErrClosed,
		wantErr:  []string{"load device state"},
	}, {
		name: "resume fails",
		steps: func(*fakeQEMU) []qmptest.Step {
			return append(loadSteps(),
				qmptest.Expect("query-migrate").Return(map[string]any{"status": "completed"}),
				qmptest.Expect("set_link"),
				qmptest.Expect("cont").Fail(qmp.ClassGenericError, "Failed to get \"write\" lock"))
		},
		wantSigs: []syscall.Signal{syscall.SIGKILL},
		wantErr:  []string{"resume child", `Failed to get "write" lock`},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			q := newFakeQEMU()
			d := testDriver(t, q)
			m := fakeMachine(t, "web-1", qmptest.NewServer(t, tc.steps(q)...), "")
			if tc.log != "" {
				if err := os.WriteFile(m.Paths.Log, []byte(tc.log), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			err := d.Complete(t.Context(), m, fakeTemplate(t))
			if err == nil {
				t.Fatal("Complete: got nil error")
			}
			if tc.wantIs != nil && !errors.Is(err, tc.wantIs) {
				t.Errorf("Complete: got %v, want it to wrap %v", err, tc.wantIs)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Complete: got %q, want it to contain %q", err, w)
				}
			}
			if got := q.signals(); !slices.Equal(got, tc.wantSigs) {
				t.Errorf("signals sent: got %v, want %v", got, tc.wantSigs)
			}
			if q.alive() {
				t.Errorf("the child's QEMU is still running")
			}
		})
	}
}

// SetLink switches a machine's backend when it has one (QEMU switches its
// NIC with it, and the backend drops what was queued while it was down),
// its NIC when it has none.
func TestSetLinkName(t *testing.T) {
	for _, tc := range []struct {
		net  vmfork.Network
		want string
	}{{vmfork.Network{}, netdevID}, {vmfork.Network{Kind: vmfork.NetworkNone}, nicID}} {
		sock := qmptest.NewServer(t, qmptest.Expect("set_link").WithArgs(map[string]any{"name": tc.want, "up": true}))
		m := fakeMachine(t, "web-1", sock, "")
		m.Spec.Network = tc.net
		if err := testDriver(t, newFakeQEMU()).SetLink(t.Context(), m, true); err != nil {
			t.Errorf("SetLink (network %q): %v", tc.net.Kind, err)
		}
	}
}
