package vmfork

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestParseNetwork(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Network
		ok   bool
	}{
		{"user", Network{Kind: NetworkUser}, true},
		{"none", Network{Kind: NetworkNone}, true},
		{"bridge=br0", Network{Kind: NetworkBridge, Name: "br0"}, true},
		{"network=isolated", Network{Kind: NetworkLibvirt, Name: "isolated"}, true},
		{"bridge", Network{}, false},
		{"bridge=", Network{}, false},
		{"bridge=a-name-longer-than-15", Network{}, false},
		{"bridge=a/b", Network{}, false},
		{"user=x", Network{}, false},
		{"tap", Network{}, false},
	} {
		got, err := ParseNetwork(c.in)
		if c.ok && (err != nil || got != c.want) {
			t.Errorf("ParseNetwork(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
		if !c.ok && !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseNetwork(%q) = %+v, %v; want an ErrInvalid", c.in, got, err)
		}
		if c.ok && got.String() != c.in {
			t.Errorf("ParseNetwork(%q).String() = %q", c.in, got.String())
		}
	}
	if got := (Network{}).Effective(); got.Kind != NetworkUser {
		t.Errorf("zero network is %q, want user (records from before the field)", got.Kind)
	}
}

func TestCheckBridge(t *testing.T) {
	sys := t.TempDir()
	for _, d := range []string{"br0/bridge", "eth0"} {
		if err := os.MkdirAll(filepath.Join(sys, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	exists := func(name string) bool { return name == "br0" || name == "eth0" }
	if err := checkBridgeIn(sys, exists, "br0"); err != nil {
		t.Errorf("br0: %v, want nil", err)
	}
	for name, want := range map[string]string{
		"eth0":  `interface "eth0" is not a bridge: invalid argument`,
		"nobr0": "bridge \"nobr0\" does not exist (create it, e.g. `ip link add nobr0 type bridge`): invalid argument",
	} {
		err := checkBridgeIn(sys, exists, name)
		if !errors.Is(err, ErrInvalid) || err.Error() != want {
			t.Errorf("%s: got %v, want %q", name, err, want)
		}
	}
}

func TestSpecValidateNetwork(t *testing.T) {
	kernel := filepath.Join(t.TempDir(), "vmlinuz")
	if err := os.WriteFile(kernel, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	s := Spec{Kernel: kernel, MemoryMiB: 256, CPUs: 1, Ports: []PortForward{{Host: 0, Guest: 22}}, Network: Network{Kind: NetworkNone}}
	if err := s.Validate(); !errors.Is(err, ErrInvalid) {
		t.Errorf("port forward on network none: %v, want ErrInvalid", err)
	}
	s.Ports = nil
	if err := s.Validate(); err != nil {
		t.Errorf("network none: %v", err)
	}
	s.Network = Network{Kind: NetworkBridge, Name: "vmfnobr0"}
	if err := s.Validate(); !errors.Is(err, ErrInvalid) {
		t.Errorf("missing bridge: %v, want ErrInvalid", err)
	}
	s.Network = Network{Kind: "tap"}
	if err := s.Validate(); !errors.Is(err, ErrInvalid) {
		t.Errorf("unknown kind: %v, want ErrInvalid", err)
	}
}
