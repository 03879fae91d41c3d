package vmfork

import (
	"os/exec"
	"testing"
)

// ShellQuote's output, read back by a real sh, is the word it was given:
// fork --to hands the remote fork's arguments to the other host's shell.
func TestShellQuote(t *testing.T) {
	for _, w := range []string{"kid", "--hostname={name}-b", "", "a b", "it's", `"$(touch /tmp/x)"`, "--step-timeout=vmfork.clock=5s", "*", "a\nb"} {
		out, err := exec.Command("sh", "-c", "printf %s "+ShellQuote(w)).Output()
		if err != nil {
			t.Fatalf("sh on %q: %v", ShellQuote(w), err)
		}
		if string(out) != w {
			t.Errorf("ShellQuote(%q) = %s, read back as %q", w, ShellQuote(w), out)
		}
	}
}
