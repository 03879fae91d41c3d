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

// startVictim stops the victim for a start to be killed.
func (r *rig) startVictim(*rig, int) []string {
	r.ok("stop", "victim")
	return []string{"start", "victim"}
}

// victimStartsAgain checks that a start cut short left the victim
// stopped, with no QEMU of it, and that it starts on the next try.
func victimStartsAgain(r *rig, _ int) {
	r.t.Helper()
	if m := r.machine("victim"); m.State != "stopped" || m.PID != 0 {
		r.t.Fatalf("after the repair victim is %+v, want it stopped", m)
	}
	r.ok("start", "victim")
	if m := r.machine("victim"); m.State != "running" || r.qmpStatus(m.QMP) != "running" {
		r.t.Errorf("victim after starting again: %+v, want it running", m)
	}
}
