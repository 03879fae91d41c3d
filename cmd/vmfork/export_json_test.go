package main

import (
	"testing"

	"github.com/vmfork/vmfork"
)

// The JSON of template export and import is a contract like the rest
// (TestJSONGolden): these golden files change only by adding keys.
func TestExportImportJSONGolden(t *testing.T) {
	for name, v := range map[string]any{
		"template-export.json": &vmfork.ExportResult{
			Name: "golden", ID: "web.2", File: "/srv/golden.vmt", Archive: 49108930,
			Stored: 113858593, Logical: 282855457, Elapsed: 476.0, HasMemory: true,
		},
		"template-import.json": &vmfork.ImportResult{
			Name: "golden2", ID: "web.1", Source: "web", HasMemory: true, Files: 5, Stored: 113858593, Elapsed: 335.8,
		},
		"rewind.json": &vmfork.ChildResult{
			Name: "agent", PID: 4242, State: vmfork.StateRunning, Ports: []vmfork.PortForward{{Host: 40022, Guest: 22}},
		},
	} {
		checkGolden(t, name, v)
	}
}
