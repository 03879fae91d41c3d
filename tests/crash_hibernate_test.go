//go:build integration

package tests

import (
	"fmt"
	"strings"
)

// Rows of the crash matrix (crash_test.go) for hibernate, resume and rewind,
// run on the matrix's victim machine, booted for each run.

func (r *rig) hibernateVictim(*rig, int) []string { return []string{"hibernate", "victim"} }

func (r *rig) resumeVictim(*rig, int) []string {
	r.ok("hibernate", "victim")
	return []string{"resume", "victim"}
}

func (r *rig) rewindVictim(_ *rig, i int) []string {
	r.ok("checkpoint", "victim", "--as", fmt.Sprintf("vcp%d", i))
	return []string{"rewind", "victim", "--to", fmt.Sprintf("vcp%d", i)}
}

// victimIs returns a check that the repair left the victim in state want,
// and that it goes on from there: a hibernated victim resumes, a running
// one hibernates and resumes.
func victimIs(want string) func(*rig, int) {
	return func(r *rig, i int) {
		r.t.Helper()
		if m := r.machine("victim"); m.State != want {
			r.t.Fatalf("after the repair victim is %+v, want %s", m, want)
		}
		switch want {
		case "running":
			r.ok("hibernate", "victim")
			r.ok("resume", "victim")
		case "hibernated":
			r.ok("resume", "victim")
		case "stopped": // a rewind undone
			r.ok("template", "rm", fmt.Sprintf("vcp%d", i))
		}
		if want != "stopped" {
			if m := r.machine("victim"); m.State != "running" || r.qmpStatus(m.QMP) != "running" {
				r.t.Errorf("victim after resuming: %+v, want it running", m)
			}
		}
	}
}

// startChild forks a child of the shared source and stops it, for a start
// to be killed: a fork costs a fraction of a victim's boot, and the start
// itself is the cold boot a victim would have had.
func (r *rig) startChild(_ *rig, _ int) []string {
	r.t.Helper()
	var res forkJSON
	r.jsonOK(&res, "fork", "src", "--count", "1", "--prefix", "cold")
	name := res.Children[0].Name
	r.ok("stop", name)
	return []string{"start", name}
}

// childStillStopped checks that a start cut short left the child stopped
// with no process (checkProcesses has found no QEMU without a record).
// That it starts again is the conformance suite's Start and
// TestHostRestart's; a second cold boot here would double the row's time.
func childStillStopped(r *rig, _ int) {
	r.t.Helper()
	for _, m := range r.list() {
		if strings.HasPrefix(m.Name, "cold-") && (m.State != "stopped" || m.PID != 0) {
			r.t.Errorf("after a killed start: %s is %s (pid %d), want it stopped", m.Name, m.State, m.PID)
		}
	}
}
