package vmfork

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sort"
)

// HostInfo is what a placer (the Ansible fleet role, an operator choosing
// where to fork) needs to know of one host: how much room it has for new
// machines as admission (admission.go) would count it, and what it runs and
// holds. Its JSON form is read by other programs: change it only by adding.
type HostInfo struct {
	Hostname string `json:"hostname"`
	Driver   string `json:"driver"`
	CPUs     int    `json:"cpus"`
	// CPUPressure is /proc/pressure/cpu's "some avg10" (percent), -1 where
	// the kernel has none.
	CPUPressure       float64 `json:"cpu_pressure_pct"`
	RAMTotalBytes     int64   `json:"ram_total_bytes"`
	RAMAvailableBytes int64   `json:"ram_available_bytes"`
	RAMReserveBytes   int64   `json:"ram_reserve_bytes"`
	Overcommit        float64 `json:"overcommit"`
	// RAMForNewBytes is what admission lets new machines take now:
	// (available - reserve) * overcommit. A placer divides it by a child's
	// estimate (TemplateInfo.ChildRAMBytes) to count the children that fit.
	RAMForNewBytes    int64          `json:"ram_for_new_bytes"`
	MemDir            string         `json:"mem_dir"`
	MemDirFreeBytes   int64          `json:"mem_dir_free_bytes"`
	MemDirTmpfs       bool           `json:"mem_dir_tmpfs"`
	StateDir          string         `json:"state_dir"`
	StateDirFreeBytes int64          `json:"state_dir_free_bytes"`
	Machines          MachineCounts  `json:"machines"`
	Templates         []TemplateInfo `json:"templates"`
	// TemplateRAMBytes is the RAM every template's frozen file holds.
	TemplateRAMBytes int64 `json:"template_ram_bytes"`
}

// MachineCounts counts a host's machines by state.
type MachineCounts struct {
	Running    int `json:"running"`
	Stopped    int `json:"stopped"`
	Hibernated int `json:"hibernated"`
	Other      int `json:"other"`
}

// TemplateInfo is one template a host holds, as a placer sees it.
type TemplateInfo struct {
	Name      string `json:"name,omitempty"` // empty for a live fork's template
	ID        string `json:"id"`
	Source    string `json:"source"`
	MemoryMiB int    `json:"memory_mib"`
	RAMBytes  int64  `json:"ram_bytes"`
	Children  int    `json:"children"`
	// ChildRAMBytes is what admission counts for each new child of the
	// template's source: the most an earlier child made private, or the
	// guest's RAM when none was measured (ChildRAMBasis says which).
	ChildRAMBytes int64  `json:"child_ram_bytes"`
	ChildRAMBasis string `json:"child_ram_basis"`
	// ChildrenThatFit is RAMForNewBytes / ChildRAMBytes.
	ChildrenThatFit int64 `json:"children_that_fit"`
}

// HostInfo describes this host for placement. It changes nothing.
func (mg *Manager) HostInfo(ctx context.Context) (*HostInfo, error) {
	h := mg.host()
	info := &HostInfo{
		Driver: mg.Driver.Name(), CPUs: runtime.NumCPU(), CPUPressure: -1, Overcommit: mg.Admission.ratio(),
		MemDir: mg.Store.MemDir, StateDir: mg.Store.StateDir, Templates: []TemplateInfo{},
	}
	info.Hostname, _ = os.Hostname()
	if pct, ok := h.CPUPressure(); ok {
		info.CPUPressure = pct
	}
	total, avail, err := h.Memory()
	if err != nil {
		return nil, fmt.Errorf("host info: %w", err)
	}
	info.RAMTotalBytes, info.RAMAvailableBytes, info.RAMReserveBytes = total, avail, memReserve(total)
	info.RAMForNewBytes = int64(float64(max(0, avail-info.RAMReserveBytes)) * info.Overcommit)
	if sp, err := h.Space(mg.Store.MemDir); err == nil {
		info.MemDirFreeBytes, info.MemDirTmpfs = sp.Free, sp.Tmpfs
	}
	if sp, err := h.Space(mg.Store.StateDir); err == nil {
		info.StateDirFreeBytes = sp.Free
	}
	ms, err := mg.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("host info: %w", err)
	}
	for _, m := range ms {
		switch m.State {
		case StateRunning:
			info.Machines.Running++
		case StateStopped:
			info.Machines.Stopped++
		case StateHibernated:
			info.Machines.Hibernated++
		default:
			info.Machines.Other++
		}
	}
	ts, err := mg.Store.ListTemplates()
	if err != nil {
		return nil, fmt.Errorf("host info: %w", err)
	}
	for _, t := range ts {
		st := mg.templateStatus(ctx, t, ms)
		ti := TemplateInfo{Name: st.Name, ID: st.ID, Source: st.Source, MemoryMiB: st.MemoryMiB, RAMBytes: st.RAMBytes, Children: st.Children}
		ti.ChildRAMBytes, ti.ChildRAMBasis = int64(t.Spec.MemoryMiB)<<20, "guest_ram"
		if u := mg.measureChildren(t.Source); u.Children > 0 && u.PrivateBytes > 0 {
			ti.ChildRAMBytes, ti.ChildRAMBasis = u.PrivateBytes, "measured"
		}
		if ti.ChildRAMBytes > 0 {
			ti.ChildrenThatFit = info.RAMForNewBytes / ti.ChildRAMBytes
		}
		info.TemplateRAMBytes += st.RAMBytes
		info.Templates = append(info.Templates, ti)
	}
	sort.Slice(info.Templates, func(i, j int) bool { return info.Templates[i].ID < info.Templates[j].ID })
	return info, nil
}
