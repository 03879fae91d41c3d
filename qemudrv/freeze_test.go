package qemudrv

import (
	"errors"
	"io/fs"
	"os"
	"strings"
	"testing"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/qemustate"
	"github.com/vmfork/vmfork/qmp"
	"github.com/vmfork/vmfork/qmp/qmptest"
)

// freezeSteps is a freeze of a diskless source whose RAM QEMU holds itself
// (share=off: the device state carries it), up to the pause: every check
// and preparation happens before stop.
func freezeSteps() []qmptest.Step {
	return []qmptest.Step{
		qmptest.Expect("query-migrate").Return(map[string]any{"status": "none"}), // blocked reasons
		qmptest.Expect("query-migrate").Return(map[string]any{"status": "none"}), // PrepareSave
		qmptest.Expect("migrate-set-capabilities"),
		qmptest.Expect("query-vm-generation-id").Return(map[string]string{"guid": "6b9c2d4e-0f1a-4b3c-9d8e-7f6a5b4c3d2e"}),
		qmptest.Expect("qom-get").WithArgs(map[string]string{"path": "/objects/" + ramID, "property": "share"}).Return(false),
		qmptest.Expect("getfd").WithArgs(map[string]string{"fdname": devStateFD}).ReceiveFD(func(*os.File) error { return nil }),
		qmptest.Expect("stop"),
		qmptest.Expect("migrate").WithArgs(map[string]string{"uri": "fd:" + devStateFD}),
	}
}

// closeFD is the freeze's last command, whatever its outcome: QEMU's copy of
// the device-state descriptor is released.
var closeFD = qmptest.Expect("closefd").WithArgs(map[string]string{"fdname": devStateFD})

// freezeOK runs a freeze of a diskless share=off source of QEMU q that
// succeeds, and returns what it made.
func freezeOK(t *testing.T, q *fakeQEMU) (vmfork.FreezeResult, *vmfork.Template) {
	t.Helper()
	sock := qmptest.NewServer(t, append(freezeSteps(),
		qmptest.Expect("query-migrate").Return(map[string]any{"status": "completed"}),
		qmptest.Expect("query-status").Return(map[string]any{"status": "postmigrate", "running": false}),
		qmptest.Expect("cont"),
		closeFD,
	)...)
	d := testDriver(t, q)
	tpl := fakeTemplate(t)
	os.Remove(tpl.Paths.DevState) // the freeze creates it
	fr, err := d.Freeze(t.Context(), fakeMachine(t, "web", sock, ""), tpl, vmfork.FreezeOptions{})
	if err != nil {
		t.Fatalf("Freeze: %v", err)
	}
	return fr, tpl
}

func TestFreeze(t *testing.T) {
	fr, tpl := freezeOK(t, newFakeQEMU())
	if fr.Pause <= 0 {
		t.Errorf("Freeze: pause %v, want it measured", fr.Pause)
	}
	st, err := os.Stat(tpl.Paths.RAM)
	if err != nil {
		t.Fatalf("template RAM file: %v", err)
	}
	if want := int64(64 << 20); st.Size() != want {
		t.Errorf("template RAM file: %d bytes, want %d", st.Size(), want)
	}
	if tpl.VMGenID == "" {
		t.Errorf("template: no vmgenid recorded")
	}
	// share=off: all of RAM is in the migration stream, with its
	// configuration section.
	if tpl.Manifest.DevStateFormat != "" {
		t.Errorf("template: device-state format %q, want a migration stream (\"\")", tpl.Manifest.DevStateFormat)
	}
}

// TestFreezeNoConfig: a source started for a device-sections template
// (qemustate.DevicesOnlyArgs) that has to save a migration stream writes no
// configuration section, and its template says so, so that its children get
// the arguments too.
func TestFreezeNoConfig(t *testing.T) {
	q := newFakeQEMU()
	q.args = []string{qemustate.DevicesOnlyArgs[1]}
	_, tpl := freezeOK(t, q)
	if tpl.Manifest.DevStateFormat != vmfork.DevStateNoConfig {
		t.Errorf("template: device-state format %q, want %q", tpl.Manifest.DevStateFormat, vmfork.DevStateNoConfig)
	}
}

// A freeze that fails while the source is paused resumes it (the pause
// window's rollback) and leaves no template RAM file; when the source cannot
// be resumed, the error says it is still paused (vmfork.ErrStillPaused).
func TestFreezeFailure(t *testing.T) {
	for _, tc := range []struct {
		name  string
		steps []qmptest.Step
		// wantIs are the errors the freeze's error must wrap, wantNot
		// those it must not.
		wantIs, wantNot []error
		wantErr         string
	}{{
		name: "migration fails",
		steps: []qmptest.Step{
			qmptest.Expect("query-migrate").Return(map[string]any{"status": "failed", "error-desc": "Unable to write to file"}),
			qmptest.Expect("cont"), // the rollback resumes the source
			closeFD,
		},
		wantIs:  []error{qemustate.ErrMigrationFailed},
		wantNot: []error{vmfork.ErrStillPaused},
		wantErr: "Unable to write to file",
	}, {
		name: "migration cancelled",
		steps: []qmptest.Step{
			qmptest.Expect("query-migrate").Return(map[string]any{"status": "active"}),
			qmptest.Expect("query-migrate").Return(map[string]any{"status": "cancelled"}),
			qmptest.Expect("cont"),
			closeFD,
		},
		wantIs:  []error{qemustate.ErrMigrationFailed},
		wantNot: []error{vmfork.ErrStillPaused},
	}, {
		name: "resume fails",
		steps: []qmptest.Step{
			qmptest.Expect("query-migrate").Return(map[string]any{"status": "completed"}),
			qmptest.Expect("query-status").Return(map[string]any{"status": "postmigrate", "running": false}),
			qmptest.Expect("cont").Fail(qmp.ClassGenericError, "Resetting the Virtual Machine is required"),
			// The window stays open: the rollback removes the template's
			// RAM file and tries to resume once more.
			qmptest.Expect("cont").Fail(qmp.ClassGenericError, "Resetting the Virtual Machine is required"),
			closeFD,
		},
		wantIs:  []error{vmfork.ErrStillPaused},
		wantErr: "Resetting the Virtual Machine is required",
	}, {
		name: "resume fails once",
		steps: []qmptest.Step{
			qmptest.Expect("query-migrate").Return(map[string]any{"status": "completed"}),
			qmptest.Expect("query-status").Return(map[string]any{"status": "postmigrate", "running": false}),
			qmptest.Expect("cont").Fail(qmp.ClassGenericError, "Migration is not finalized yet"),
			qmptest.Expect("cont"), // the rollback's second try resumes it
			closeFD,
		},
		wantNot: []error{vmfork.ErrStillPaused},
		wantErr: "Migration is not finalized yet",
	}, {
		name: "QMP connection dropped mid-save",
		// QEMU's monitor goes away while the source is paused: the
		// rollback cannot reach it to resume it.
		steps:   []qmptest.Step{qmptest.Expect("query-migrate").NoReply(), qmptest.Disconnect()},
		wantIs:  []error{qmp.ErrClosed, vmfork.ErrStillPaused},
		wantErr: "resuming failed too",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			q := newFakeQEMU()
			sock := qmptest.NewServer(t, append(freezeSteps(), tc.steps...)...)
			d := testDriver(t, q)
			tpl := fakeTemplate(t)
			os.Remove(tpl.Paths.DevState)
			_, err := d.Freeze(t.Context(), fakeMachine(t, "web", sock, ""), tpl, vmfork.FreezeOptions{})
			if err == nil {
				t.Fatal("Freeze: got nil error")
			}
			for _, w := range tc.wantIs {
				if !errors.Is(err, w) {
					t.Errorf("Freeze: got %v, want it to wrap %v", err, w)
				}
			}
			for _, w := range tc.wantNot {
				if errors.Is(err, w) {
					t.Errorf("Freeze: got %v, want it not to wrap %v", err, w)
				}
			}
			if tc.wantErr != "" && !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Freeze: got %q, want it to contain %q", err, tc.wantErr)
			}
			// The template's RAM is never left behind by a failed freeze.
			if _, err := os.Stat(tpl.Paths.RAM); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("template RAM file after a failed freeze: %v, want it absent", err)
			}
			if got := q.signals(); len(got) != 0 {
				t.Errorf("signals sent to the source: %v, want none", got)
			}
		})
	}
}

// A source whose QEMU is gone is refused before anything is sent to it.
func TestFreezeNotRunning(t *testing.T) {
	q := newFakeQEMU()
	q.exit()
	d := testDriver(t, q)
	_, err := d.Freeze(t.Context(), fakeMachine(t, "web", qmptest.NewServer(t), ""), fakeTemplate(t), vmfork.FreezeOptions{})
	if !errors.Is(err, vmfork.ErrNotRunning) || !strings.Contains(err.Error(), `"web"`) {
		t.Fatalf("Freeze: got %v, want ErrNotRunning naming the machine", err)
	}
}
