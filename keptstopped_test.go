package vmfork

import (
	"errors"
	"testing"
)

// A stopped machine's template holds only its disk: children of it boot
// fresh (Driver.Start), and it has no warm pool.
func TestKeepStoppedMachine(t *testing.T) {
	mg, pd := newPoolManager(t)
	fd := pd.fakeDriver
	bootFake(t, mg, "web")
	if _, err := mg.Stop(t.Context(), "web", false); err != nil {
		t.Fatal(err)
	}
	if _, err := mg.Keep(t.Context(), KeepRequest{Source: "web", Name: "golden", Pool: 1}); !errors.Is(err, ErrInvalid) {
		t.Errorf("keep of a stopped machine with a pool: %v, want ErrInvalid", err)
	}
	tpl, err := mg.Keep(t.Context(), KeepRequest{Source: "web", Name: "golden"})
	if err != nil {
		t.Fatal(err)
	}
	if tpl.HasMemory || tpl.Paths.RAM != "" || tpl.Paths.DevState != "" || fd.freezeSeen != 0 {
		t.Fatalf("template %+v (freezes %d): want disk only, no freeze of a process", tpl, fd.freezeSeen)
	}
	res, err := mg.Fork(t.Context(), ForkRequest{Source: "golden", Count: 2, Identity: quietChain})
	if err != nil || len(res.Children) != 2 {
		t.Fatalf("fork golden: %+v, %v", res, err)
	}
	for _, c := range res.Children {
		m, err := mg.Store.LoadMachine(c.Name)
		if err != nil || !fd.running[c.Name] || m.Template != tpl.ID || m.Paths.RAM == tpl.Paths.RAM {
			t.Errorf("child %s: %+v, %v; want booted fresh with a RAM file of its own", c.Name, m, err)
		}
	}
	if m, _ := mg.Store.LoadMachine("web"); m.State != StateStopped {
		t.Errorf("source is %s after the save, want stopped", m.State)
	}
}
