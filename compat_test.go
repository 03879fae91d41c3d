package vmfork

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A kept template whose manifest does not fit the host is refused at fork
// time, before any child is reserved, naming the field.
func TestForkOfKeptTemplateChecksTheHost(t *testing.T) {
	mg, fd := newTestManager(t)
	keptFake(t, mg)
	ld := &linkDriver{fakeDriver: fd}
	mg.Driver = &hostDriver{ld, "9.0.0"}
	_, err := mg.Fork(t.Context(), ForkRequest{Source: "golden", Count: 1, Identity: quietChain})
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), `QEMU version "7.2.0", this host has "9.0.0"`) {
		t.Fatalf("fork: %v, want the QEMU version named", err)
	}
	if names := machineNames(t, mg.Store); names != "" {
		t.Errorf("machines after the refusal: %s", names)
	}
	if len(fd.running) != 0 {
		t.Errorf("processes started: %v", fd.running)
	}
	if _, err := mg.SetPool(t.Context(), "golden", 1); !errors.Is(err, ErrUnsupported) {
		t.Errorf("pool start: %v, want ErrUnsupported", err)
	}
	mg.Driver = &hostDriver{ld, "7.2.0"}
	if res, err := mg.Fork(t.Context(), ForkRequest{Source: "golden", Count: 1, Identity: quietChain}); err != nil || len(res.Children) != 1 {
		t.Errorf("fork on a fitting host: %+v, %v", res, err)
	}
}

func TestCheckHostFacts(t *testing.T) {
	f := filepath.Join(t.TempDir(), "cpuinfo")
	os.WriteFile(f, []byte("processor\t: 0\nflags\t\t: fpu sse2 avx2\n"), 0o600)
	old := cpuFlagsFile
	cpuFlagsFile = f
	t.Cleanup(func() { cpuFlagsFile = old })
	tpl := &Template{Spec: Spec{CPUModel: "host"}}
	if err := checkHostFacts(tpl, HostFacts{CPUFlags: []string{"avx2", "fpu"}}); err != nil {
		t.Errorf("flags the host has: %v", err)
	}
	err := checkHostFacts(tpl, HostFacts{CPUFlags: []string{"avx512f", "fpu"}})
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), `"avx512f"`) {
		t.Errorf("a missing flag: %v, want it named", err)
	}
	tpl.Spec.CPUModel = "qemu64" // an emulated CPU: the host's flags do not matter
	if err := checkHostFacts(tpl, HostFacts{CPUFlags: []string{"avx512f"}}); err != nil {
		t.Errorf("emulated CPU model: %v", err)
	}
}
