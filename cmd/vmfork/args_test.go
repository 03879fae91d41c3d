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
		{[]string{"vmfork", "-c", "qemu:///system", "libvirt", "check", "web1", "--json"}, []string{"vmfork", "-c", "qemu:///system", "libvirt", "check", "--json", "--", "web1"}},
	}
	for _, c := range cases {
		if got := normalizeArgs(app, c.in); !slices.Equal(got, c.want) {
			t.Errorf("normalizeArgs(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
