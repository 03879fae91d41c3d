package main

import (
	"testing"

	"github.com/vmfork/vmfork"
)

// The JSON of hibernate and resume, and of their dry runs, is a contract
// like the rest (TestJSONGolden): these golden files change only by adding
// keys.
func TestHibernateJSONGolden(t *testing.T) {
	for name, v := range map[string]any{
		"hibernate.json": &vmfork.HibernateResult{
			Name: "agent", State: vmfork.StateHibernated, Template: "agent.3", PauseMS: 16.4,
			RAMFile: "/var/lib/vmfork/templates/agent.3/ram.hibernated", RAMBytes: 100376576, RAMSizeBytes: 268435456, ElapsedMS: 384.4,
		},
		"resume.json": &vmfork.ChildResult{
			Name: "agent", PID: 4242, State: vmfork.StateRunning, Ports: []vmfork.PortForward{{Host: 40022, Guest: 22}},
			RunningMS: 364.2, ReadyMS: 671.0,
		},
		"plan-hibernate.json": &vmfork.Plan{
			DryRun: true, Command: "hibernate", Changed: true, Source: "agent", SourcePauses: true, Machines: []string{"agent"},
			Actions: []string{
				`pause running machine "agent" for a fraction of a second and freeze it into a new template`,
				`write its RAM (256 MiB) sparse under the state dir and end its QEMU (pid 4242); the mem dir gets its RAM back`,
			},
		},
	} {
		checkGolden(t, name, v)
	}
}
