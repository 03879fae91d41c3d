package vmfork

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestSpecValidate(t *testing.T) {
	dir := t.TempDir()
	kernel := filepath.Join(dir, "vmlinuz")
	if err := os.WriteFile(kernel, []byte("k"), 0o600); err != nil {
		t.Fatal(err)
	}
	ok := Spec{Kernel: kernel, MemoryMiB: 256, CPUs: 1}
	if err := ok.Validate(); err != nil {
		t.Fatalf("Validate(%+v) = %v, want nil", ok, err)
	}
	cases := map[string]struct {
		spec Spec
		is   error
	}{
		"nothing to boot":  {Spec{MemoryMiB: 256, CPUs: 1}, ErrInvalid},
		"missing kernel":   {Spec{Kernel: filepath.Join(dir, "nope"), MemoryMiB: 256, CPUs: 1}, ErrInvalid},
		"relative kernel":  {Spec{Kernel: "vmlinuz", MemoryMiB: 256, CPUs: 1}, ErrInvalid},
		"kernel is a dir":  {Spec{Kernel: dir, MemoryMiB: 256, CPUs: 1}, ErrInvalid},
		"initrd no kernel": {Spec{Disk: kernel, Initrd: kernel, MemoryMiB: 256, CPUs: 1}, ErrInvalid},
		"tiny memory":      {Spec{Kernel: kernel, MemoryMiB: 8, CPUs: 1}, ErrInvalid},
		"no cpus":          {Spec{Kernel: kernel, MemoryMiB: 256}, ErrInvalid},
		"port twice":       {Spec{Kernel: kernel, MemoryMiB: 256, CPUs: 1, Ports: []PortForward{{2222, 22}, {2222, 80}}}, ErrInvalid},
	}
	for name, c := range cases {
		err := c.spec.Validate()
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: Validate() = %v, want ErrInvalid", name, err)
		}
		if !errors.Is(err, c.is) {
			t.Errorf("%s: Validate() = %v, want %v", name, err, c.is)
		}
	}
}
