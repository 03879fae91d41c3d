package main

import (
	"testing"

	"github.com/vmfork/vmfork"
)

// TestDiskCommitJSON: disk commit --json is a list, one object per disk.
func TestDiskCommitJSON(t *testing.T) {
	checkGolden(t, "disk-commit.json", []vmfork.DiskCommit{
		{Machine: "db", ID: "data", Device: "/dev/vg0/data", Layers: []string{"/s/machines/db/xdisk-data.2.qcow2", "/s/templates/db.1/disk-data.qcow2"}, Bytes: 1 << 20, MS: 12},
		{Machine: "db", ID: "logs", Device: "/dev/vg0/logs", Layers: []string{}},
	})
}
