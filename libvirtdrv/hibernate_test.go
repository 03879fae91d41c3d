package libvirtdrv

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/vmfork/vmfork"
)

// Hibernate and resume need starts in place (a new process for a record
// whose files stay), which libvirt domains do not offer: both are refused
// with one line naming the driver, before any libvirt call, so nothing is
// paused.
func TestHibernateNotSupported(t *testing.T) {
	store, err := vmfork.OpenStore(t.TempDir(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	mg := vmfork.NewManager(store, &Driver{}, nil) // no connection: a libvirt call would fail
	_, herr := mg.Hibernate(t.Context(), "web")
	_, rerr := mg.Resume(t.Context(), vmfork.ResumeRequest{Machine: "web"})
	_, perr := mg.PlanHibernate(t.Context(), "web")
	for verb, err := range map[string]error{"hibernate": herr, "resume": rerr, "hibernate --dry-run": perr} {
		want := strings.Fields(verb)[0] + " is not supported by the libvirt driver"
		if !errors.Is(err, vmfork.ErrUnsupported) || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want one line saying %q", verb, err, want)
		}
	}
	if es, _ := os.ReadDir(store.StateDir + "/journal"); len(es) != 0 {
		t.Errorf("a refused hibernate journaled %d entries", len(es))
	}
}
