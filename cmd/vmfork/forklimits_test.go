package main

import (
	"os"
	"path/filepath"
	"testing"
)

// fork and explore share --parallel and --max-children and refuse both
// below 1 as bad input (exit 2) before touching the store; explore used to
// pass 0 on, where it silently meant the default.
func TestForkLimitsRefusedByForkAndExplore(t *testing.T) {
	for _, cmd := range [][]string{{"fork"}, {"explore", "--try", "true"}} {
		for _, flag := range []string{"--parallel", "--max-children"} {
			for _, v := range []string{"0", "-1"} {
				state := filepath.Join(t.TempDir(), "state")
				args := append([]string{"--state-dir", state, "--mem-dir", t.TempDir()}, cmd...)
				if _, code := runCLI(t, append(args, flag+"="+v, "src")...); code != 2 {
					t.Errorf("%v %s %s: exit %d, want 2", cmd, flag, v, code)
				}
				if _, err := os.Stat(state); !os.IsNotExist(err) {
					t.Errorf("%v %s %s: state dir made (%v)", cmd, flag, v, err)
				}
			}
		}
	}
}
