package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/vmfork/vmfork"
)

// template ls and checkpoint ls print one table: a kept template with its
// RAM held, its kind (full, or delta/N: N deltas a child applies) and what
// it holds alone, and a fork's own (no name, no memory) with dashes.
func TestPrintTemplates(t *testing.T) {
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.Local)
	ts := []vmfork.TemplateStatus{
		{Name: "golden", ID: "web.2", Source: "web", Created: created, MemoryMiB: 256, HasMemory: true, RAMBytes: 3 << 20, Children: 1, Pooled: 2, PoolSize: 4,
			DeltaStats: &vmfork.DeltaStats{Kind: "full", AloneBytes: 3 << 20}},
		{ID: "web.3", Source: "web", Created: created, MemoryMiB: 256},
		{Name: "gone", ID: "web.4", Source: "web", Created: created, MemoryMiB: 256, HasMemory: true, RAMLost: true},
		{ID: "web.5", Source: "web", Created: created, MemoryMiB: 256, HasMemory: true, RAMBytes: 1 << 20, RAMDelta: true, Children: 1,
			DeltaStats: &vmfork.DeltaStats{Kind: "delta", Depth: 3, AloneBytes: 1 << 20}},
	}
	var b bytes.Buffer
	if err := printTemplates(&b, ts); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"NAME    ID     SOURCE  MEMORY   RAM HELD       KIND     ALONE    CHILDREN  POOL  CREATED",
		"golden  web.2  web     256 MiB  3.0 MiB        full     3.0 MiB  1         2/4   2026-01-02 03:04:05",
		"-       web.3  web     256 MiB  -              -        -        0         0/0   2026-01-02 03:04:05",
		"gone    web.4  web     256 MiB  lost           -        -        0         0/0   2026-01-02 03:04:05",
		"-       web.5  web     256 MiB  1.0 MiB delta  delta/3  1.0 MiB  1         0/0   2026-01-02 03:04:05",
	}
	if got := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("table:\n%s\nwant:\n%s", b.String(), strings.Join(want, "\n"))
	}
}
