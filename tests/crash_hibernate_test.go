//go:build integration

package tests

import "fmt"

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
