package main

import (
	"slices"
	"testing"
)

func TestNormalizeArgs(t *testing.T) {
	app := newApp()
	cases := []struct{ in, want []string }{
		{[]string{"vmfork", "boot", "g", "--kernel", "k", "--json"}, []string{"vmfork", "boot", "--kernel", "k", "--json", "--", "g"}},
		{[]string{"vmfork", "--state-dir", "/s", "-q", "ls", "--json"}, []string{"vmfork", "--state-dir", "/s", "-q", "ls", "--json"}},
		{[]string{"vmfork", "exec", "g", "--", "sh", "-c", "exit 3"}, []string{"vmfork", "exec", "--", "g", "sh", "-c", "exit 3"}},
		{[]string{"vmfork", "exec", "--stdin", "g", "--", "cat", "--json"}, []string{"vmfork", "exec", "--stdin", "--", "g", "cat", "--json"}},
		{[]string{"vmfork", "fork", "web", "a", "b", "--count=2"}, []string{"vmfork", "fork", "--count=2", "--", "web", "a", "b"}},
		{[]string{"vmfork", "boot", ""}, []string{"vmfork", "boot", "--", ""}},
		{[]string{"vmfork"}, []string{"vmfork"}},
		// Global flags after the command move in front of it.
		{[]string{"vmfork", "boot", "g", "--timeout", "5m", "--json"}, []string{"vmfork", "--timeout", "5m", "boot", "--json", "--", "g"}},
		{[]string{"vmfork", "-q", "fork", "web", "--state-dir=/s", "--count", "2"}, []string{"vmfork", "-q", "--state-dir=/s", "fork", "--count", "2", "--", "web"}},
		{[]string{"vmfork", "libvirt", "-c", "qemu:///system", "check", "d"}, []string{"vmfork", "-c", "qemu:///system", "libvirt", "check", "--", "d"}},
		{[]string{"vmfork", "exec", "g", "--", "ls", "--timeout", "1"}, []string{"vmfork", "exec", "--", "g", "ls", "--timeout", "1"}},
		{[]string{"vmfork", "-c", "qemu:///system", "libvirt", "check", "web1", "--json"}, []string{"vmfork", "-c", "qemu:///system", "libvirt", "check", "--json", "--", "web1"}},
	}
	for _, c := range cases {
		if got := normalizeArgs(app, c.in); !slices.Equal(got, c.want) {
			t.Errorf("normalizeArgs(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
