package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestGuestRef(t *testing.T) {
	for _, c := range []struct {
		in, name, path string
		ok             bool
	}{
		{"web-1:/etc/motd", "web-1", "/etc/motd", true},
		{"web-1:rel", "web-1", "rel", true},
		{"./a:b", "", "", false},
		{"/tmp/a:b", "", "", false},
		{"file.txt", "", "", false},
		{"-", "", "", false},
		{":/x", "", "", false},
	} {
		name, path, ok := guestRef(c.in)
		if name != c.name || path != c.path || ok != c.ok {
			t.Errorf("guestRef(%q) = %q, %q, %v; want %q, %q, %v", c.in, name, path, ok, c.name, c.path, c.ok)
		}
	}
}

// Bad input is refused with exit 2 before any machine is looked up; an
// unknown machine is exit 4.
func TestCpRefusesBadInput(t *testing.T) {
	state, mem := t.TempDir(), t.TempDir()
	src := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(src, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	g := []string{"--state-dir", state, "--mem-dir", mem, "-q", "cp"}
	for _, c := range []struct {
		args []string
		want int
	}{
		{[]string{src}, 2},
		{[]string{src, "/tmp/x"}, 2},
		{[]string{"a:/x", "b:/y"}, 2},
		{[]string{src, "web:relative"}, 2},
		{[]string{src, "Bad_Name:/x"}, 2},
		{[]string{"/nonexistent/file", "web:/x"}, 2},
		{[]string{src, "web:/x"}, 4},
		{[]string{"web:/x", filepath.Join(t.TempDir(), "out")}, 4},
	} {
		if _, code := runCLI(t, append(append([]string{}, g...), c.args...)...); code != c.want {
			t.Errorf("cp %v: exit %d, want %d", c.args, code, c.want)
		}
	}
}
