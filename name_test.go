package vmfork

import (
	"errors"
	"strings"
	"testing"
)

func TestValidateName(t *testing.T) {
	good := []string{"g", "web-1", "0", "a" + strings.Repeat("b", 62)}
	for _, n := range good {
		if err := ValidateName(n); err != nil {
			t.Errorf("ValidateName(%q) = %v, want nil", n, err)
		}
	}
	bad := []string{"", "../x", "x/y", "UPPER", "-lead", "a_b", "a.b", "a" + strings.Repeat("b", 63), "sp ace", "ü"}
	for _, n := range bad {
		err := ValidateName(n)
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("ValidateName(%q) = %v, want ErrInvalid", n, err)
		}
		if err != nil && strings.Contains(err.Error(), "\n") {
			t.Errorf("ValidateName(%q) error has several lines: %q", n, err)
		}
	}
}

func TestParseMemory(t *testing.T) {
	for in, want := range map[string]int{"512M": 512, "512": 512, "2G": 2048, "1g": 1024, "256MiB": 256, "1GB": 1024} {
		got, err := ParseMemory(in)
		if err != nil || got != want {
			t.Errorf("ParseMemory(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "-1G", "0", "1T"} {
		if _, err := ParseMemory(in); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseMemory(%q) error = %v, want ErrInvalid", in, err)
		}
	}
}

func TestParsePortForward(t *testing.T) {
	for in, want := range map[string]PortForward{"2222:22": {2222, 22}, "80": {0, 80}} {
		got, err := ParsePortForward(in)
		if err != nil || got != want {
			t.Errorf("ParsePortForward(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "a:b", "1:0", "70000:22", "22:70000", ":22"} {
		if _, err := ParsePortForward(in); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParsePortForward(%q) error = %v, want ErrInvalid", in, err)
		}
	}
}
