//go:build cgo

package libvirtdrv

import (
	"errors"
	"strings"
	"testing"

	"github.com/vmfork/vmfork"
)

// testDriver connects to libvirt's built-in test driver, which keeps domains
// in memory: lifecycle and XML round trips, no QEMU (reference: STYLE §7).
// Each test gets a fresh, private instance of it.
func testDriver(t *testing.T) *Driver {
	t.Helper()
	d, err := New("test:///default", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// createTestDomain creates machine m's domain as BootXML builds it, as a
// domain of the test driver's own type.
func createTestDomain(t *testing.T, d *Driver, m *vmfork.Machine) {
	t.Helper()
	def := BootXML(m, d.metadata(m, nil), BootOptions{User: "+0:+0"})
	def.Type = "test"
	x, err := def.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	dom, err := d.conn.DomainCreateXML(x, 0)
	if err != nil {
		t.Fatalf("create: %v", wrap(err))
	}
	dom.Free()
}

func TestDriverOwnsOnlyItsDomains(t *testing.T) {
	d := testDriver(t)
	ctx := t.Context()
	m := testMachine()
	if st, err := d.Status(ctx, m); err != nil || st != vmfork.StateStopped {
		t.Fatalf("status without a domain = %q, %v, want stopped", st, err)
	}
	createTestDomain(t, d, m)
	if st, err := d.Status(ctx, m); err != nil || st != vmfork.StateRunning {
		t.Errorf("status = %q, %v, want running", st, err)
	}
	if err := d.checkNameFree(m); !errors.Is(err, vmfork.ErrInvalid) {
		t.Errorf("checkNameFree of a running machine = %v, want ErrInvalid", err)
	}

	// The same name in another state dir is another machine: vmfork must
	// neither report nor stop that domain.
	other := testMachine()
	other.Paths.Dir = "/elsewhere/machines/web"
	if st, err := d.Status(ctx, other); err != nil || st != vmfork.StateStopped {
		t.Errorf("status of a same-named machine elsewhere = %q, %v, want stopped", st, err)
	}
	if err := d.checkNameFree(other); !errors.Is(err, vmfork.ErrExists) {
		t.Errorf("checkNameFree with a foreign domain of that name = %v, want ErrExists", err)
	}
	if err := d.Stop(ctx, other, true); err != nil {
		t.Errorf("stop of the other machine: %v", err)
	}
	if st, _ := d.Status(ctx, m); st != vmfork.StateRunning {
		t.Errorf("stopping a same-named machine elsewhere stopped this one: %q", st)
	}

	if err := d.Stop(ctx, m, true); err != nil {
		t.Fatalf("stop: %v", err)
	}
	if st, err := d.Status(ctx, m); err != nil || st != vmfork.StateStopped {
		t.Errorf("status after stop = %q, %v, want stopped", st, err)
	}
	if err := d.Stop(ctx, m, true); err != nil {
		t.Errorf("second stop: %v, want nil (idempotent)", err)
	}
}

func TestCheckDomain(t *testing.T) {
	d := testDriver(t)
	ctx := t.Context()
	m := testMachine()
	createTestDomain(t, d, m)
	if err := d.CheckDomain(ctx, m.Name); err != nil {
		t.Errorf("CheckDomain of a domain vmfork booted = %v, want forkable", err)
	}
	// The test driver's stock domain has anonymous RAM and no balloon
	// setting, like most hand-made domains.
	err := d.CheckDomain(ctx, "test")
	var ue *UnforkableError
	if !errors.As(err, &ue) || !strings.Contains(err.Error(), "<memoryBacking><source type='file'/>") {
		t.Errorf("CheckDomain(test) = %v, want an error naming <memoryBacking>", err)
	}
	if err := d.CheckDomain(ctx, "no-such-domain"); !errors.Is(err, vmfork.ErrNotFound) {
		t.Errorf("CheckDomain of a missing domain = %v, want ErrNotFound", err)
	}
}
