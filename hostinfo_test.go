package vmfork

import (
	"encoding/json"
	"testing"
)

// TestHostInfo: host info counts room as admission does, and a template's
// children that fit by what its earlier children made private.
func TestHostInfo(t *testing.T) {
	mg, _ := newTestManager(t)
	h := thisHost(mg.Store)
	mg.Host = h
	bootFake(t, mg, "web")
	ctx := t.Context()
	info, err := mg.HostInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantRoom := int64(float64(h.avail-memReserve(h.total)) * DefaultOvercommit)
	if info.RAMForNewBytes != wantRoom || info.Machines.Running != 1 || len(info.Templates) != 0 {
		t.Fatalf("before a fork: %+v; want room %d, 1 running, no templates", info, wantRoom)
	}
	if _, err := mg.Fork(ctx, ForkRequest{Source: "web", Count: 1, Identity: quietChain}); err != nil {
		t.Fatal(err)
	}
	h.private["web-1"] = 512 << 20
	mg.Admission = AdmissionPolicy{Overcommit: 1}
	info, err = mg.HostInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Machines.Running != 2 || len(info.Templates) != 1 {
		t.Fatalf("after a fork: %+v; want 2 running, one template", info)
	}
	ti := info.Templates[0]
	wantRoom = h.avail - memReserve(h.total)
	if ti.Source != "web" || ti.Children != 1 || ti.ChildRAMBytes != 512<<20 || ti.ChildRAMBasis != "measured" ||
		ti.ChildrenThatFit != wantRoom/(512<<20) || info.RAMForNewBytes != wantRoom {
		t.Errorf("template %+v, room %d; want 1 child of web measured at 512 MiB, %d fit", ti, info.RAMForNewBytes, wantRoom/(512<<20))
	}
	// The JSON names are what the fleet role reads.
	data, _ := json.Marshal(info)
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"ram_for_new_bytes", "machines", "templates", "cpu_pressure_pct", "mem_dir_free_bytes"} {
		if _, ok := doc[k]; !ok {
			t.Errorf("host info JSON has no %q: %s", k, data)
		}
	}
}
