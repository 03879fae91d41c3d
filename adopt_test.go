package vmfork

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmfork/vmfork/customize"
)

// adoptDriver is the fake driver with machines of its own that vmfork did not
// make: Adopt takes in the running ones named in foreign.
type adoptDriver struct {
	*linkDriver
	foreign   map[string]bool
	adoptErr  error
	disownErr error
	disowned  []string
}

func newAdoptDriver(t *testing.T) (*Manager, *adoptDriver) {
	t.Helper()
	mg, fd := newTestManager(t)
	d := &adoptDriver{linkDriver: &linkDriver{fakeDriver: fd}, foreign: map[string]bool{}}
	mg.Driver = d
	return mg, d
}

func (d *adoptDriver) Adopt(_ context.Context, name string, paths Paths) (*Machine, error) {
	if d.adoptErr != nil {
		return nil, d.adoptErr
	}
	if !d.foreign[name] {
		return nil, fmt.Errorf("no domain %q: %w", name, ErrNotFound)
	}
	d.mu.Lock()
	d.running[name] = true
	d.mu.Unlock()
	return &Machine{Name: name, Driver: d.Name(), State: StateRunning, Spec: Spec{MemoryMiB: 256, CPUs: 1},
		Paths: paths, Created: time.Now().UTC(), Adopted: &Adoption{ID: "uuid-" + name}}, nil
}

func (d *adoptDriver) Disown(_ context.Context, m *Machine) error {
	d.disowned = append(d.disowned, m.Name)
	return d.disownErr
}

// okChain is an identity chain that needs no guest agent.
var okChain = IdentityOptions{Edit: chainOf(customize.Step{Name: "t.ok", Fn: func(context.Context, *customize.Env) error { return nil }})}

func TestForkAdoptsAForeignMachine(t *testing.T) {
	mg, d := newAdoptDriver(t)
	d.foreign["web"] = true
	res, err := mg.Fork(t.Context(), ForkRequest{Source: "web", Count: 2, Identity: okChain})
	if err != nil || len(res.Children) != 2 {
		t.Fatalf("Fork = %+v, %v; want two children", res, err)
	}
	src, err := mg.Store.LoadMachine("web")
	if err != nil || src.Adopted == nil || src.Adopted.ID != "uuid-web" {
		t.Fatalf("record of the adopted source = %+v, %v; want Adopted set", src, err)
	}
	// rm forgets it: its record goes, the machine runs on.
	if err := mg.Remove(t.Context(), "web", false); err != nil {
		t.Fatalf("rm of the adopted source: %v", err)
	}
	if st, _ := d.Status(t.Context(), src); st != StateRunning {
		t.Errorf("rm stopped the adopted machine: %s", st)
	}
	if _, err := mg.Store.LoadMachine("web"); !errors.Is(err, ErrNotFound) || exists(src.Paths.Dir) {
		t.Errorf("record after rm: %v, dir left %v; want both gone", err, exists(src.Paths.Dir))
	}
	if got := machineNames(t, mg.Store); got != "web-1,web-2" {
		t.Errorf("machines = %s, want the children only", got)
	}
}

func TestRemoveOfAnAdoptedMachineThatStillUsesVmforkFiles(t *testing.T) {
	mg, d := newAdoptDriver(t)
	d.foreign["web"] = true
	if _, err := mg.Fork(t.Context(), ForkRequest{Source: "web", Count: 1, Identity: okChain}); err != nil {
		t.Fatal(err)
	}
	d.disownErr = errors.New("domain still uses disk.1.qcow2")
	for _, force := range []bool{false, true} {
		err := mg.Remove(t.Context(), "web", force)
		if err == nil || !strings.Contains(err.Error(), "disk.1.qcow2") {
			t.Errorf("rm (force %v) = %v, want the driver's refusal", force, err)
		}
	}
	if _, err := mg.Store.LoadMachine("web"); err != nil {
		t.Errorf("record after a refused rm: %v, want it kept", err)
	}
	if st, _ := d.Status(t.Context(), &Machine{Name: "web"}); st != StateRunning {
		t.Errorf("a refused rm stopped the machine: %s", st)
	}
}

func TestForkOfAForeignMachineThatFailsLeavesNoRecord(t *testing.T) {
	cases := []struct {
		name string
		req  ForkRequest
		prep func(d *adoptDriver)
	}{
		{"unforkable", ForkRequest{Source: "web", Count: 1}, func(d *adoptDriver) {
			d.adoptErr = fmt.Errorf("<memballoon model='virtio'>: %w", ErrUnsupported)
		}},
		{"bad child name", ForkRequest{Source: "web", Names: []string{"web"}}, nil},
		{"freeze fails", ForkRequest{Source: "web", Count: 1}, func(d *adoptDriver) {
			d.freezeErr = errors.New("injected freeze failure")
		}},
		{"no child comes up", ForkRequest{Source: "web", Count: 1, Identity: IdentityOptions{Edit: chainOf(customize.Step{
			Name: "t.fail", Fn: func(context.Context, *customize.Env) error { return errors.New("injected") }})}}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			mg, d := newAdoptDriver(t)
			d.foreign["web"] = true
			if c.prep != nil {
				c.prep(d)
			}
			if _, err := mg.Fork(t.Context(), c.req); err == nil {
				t.Fatal("Fork succeeded, want an error")
			}
			if got := machineNames(t, mg.Store); got != "" {
				t.Errorf("machines = %q, want none", got)
			}
			if n := dirEntries(t, filepath.Join(mg.Store.StateDir, dirTemplates)); n != 0 {
				t.Errorf("%d templates left", n)
			}
		})
	}
}

func TestForkRefusesAStoppedAdoptedMachine(t *testing.T) {
	mg, d := newAdoptDriver(t)
	d.foreign["web"] = true
	if _, err := mg.Fork(t.Context(), ForkRequest{Source: "web", Count: 1, Identity: okChain}); err != nil {
		t.Fatal(err)
	}
	if _, err := mg.Stop(t.Context(), "web", true); err != nil {
		t.Fatal(err)
	}
	_, err := mg.Fork(t.Context(), ForkRequest{Source: "web", Count: 1, Identity: okChain})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "only while it runs") {
		t.Errorf("Fork of a stopped adopted machine = %v, want ErrInvalid", err)
	}
}

// A template whose frozen disk is an adopted machine's own image, recorded
// where it is, goes when its last child does; the image stays, and the
// chain that reads it is not rewritten.
func TestCollectTemplatesLeavesAForeignDisk(t *testing.T) {
	mg, _ := newTestManager(t)
	user := t.TempDir()
	for _, f := range []string{"base.qcow2", "top.qcow2"} { // top's backing file is base.qcow2
		data, err := os.ReadFile(filepath.Join("overlay", "testdata", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(user, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	before := readAll(t, user)
	// A stopped machine on top.qcow2: a template disk in its chain would be
	// rebased out of it with qemu-img.
	m := &Machine{Name: "web", Driver: "other", State: StateStopped, Spec: Spec{Disk: filepath.Join(user, "top.qcow2")},
		Paths: mg.Store.MachinePaths("web"), Adopted: &Adoption{ID: "x"}}
	m.Paths.Disk = m.Spec.Disk
	if err := mg.Store.CreateMachine(m); err != nil {
		t.Fatal(err)
	}
	tpl, err := mg.Store.NewTemplate("web")
	if err != nil {
		t.Fatal(err)
	}
	tpl.Paths.Disk, tpl.ForeignDisk, tpl.HasMemory = filepath.Join(user, "base.qcow2"), true, true
	if err := mg.Store.WriteTemplate(tpl); err != nil {
		t.Fatal(err)
	}
	mg.collectTemplates(t.Context())
	if exists(tpl.Paths.Dir) {
		t.Errorf("template %s kept with no child", tpl.ID)
	}
	if after := readAll(t, user); after != before {
		t.Errorf("the user's images changed")
	}
}

func readAll(t *testing.T, dir string) string {
	t.Helper()
	var b bytes.Buffer
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s %x\n", e.Name(), data)
	}
	return b.String()
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}
