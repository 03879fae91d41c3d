package vmfork

// fork --disk-only: the children of a running source boot fresh from a
// consistent view of its disks, and the source's vCPUs never stop. The
// guest agent freezes the guest's filesystems (guest-fsfreeze-freeze) for
// the moment of the disk switch (DiskForker.SwitchDisks: the transaction a
// live fork switches its disks with) and thaws them at once; no device
// state or RAM is saved. A guest whose agent cannot freeze is refused
// before anything changes, unless the request accepts a crash-consistent
// copy (ForkRequest.CrashConsistent): then the disks switch unfrozen, as
// if the power had gone at that instant.
//
// A frozen filesystem blocks every writer in the guest, so the freeze is
// bounded (FSFreezeTimeout), thawed on every error path (a deferred thaw),
// and journaled: the fork's journal entry says Thaw, and the repair of a
// vmfork killed in the window thaws the guest (repairFork).

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/vmfork/vmfork/qmp"
)

const (
	// FSFreezeTimeout bounds guest-fsfreeze-freeze, which waits for the
	// guest's dirty data to reach its disks; a guest that cannot sync by
	// then is thawed and the fork fails.
	FSFreezeTimeout = 20 * time.Second
	// fsThawTimeout bounds the thaw, which runs even after the caller's
	// ctx ended.
	fsThawTimeout = 10 * time.Second
	// agentProbeTimeout bounds the plan's question to the agent.
	agentProbeTimeout = 10 * time.Second

	agentCmdFreeze = "guest-fsfreeze-freeze"
	agentCmdThaw   = "guest-fsfreeze-thaw"
	agentCmdInfo   = "guest-info"
)

// FaultDiskOnlyFrozen: a disk-only fork has frozen the guest's
// filesystems; its disks are not switched yet, and nothing thaws them but
// this process or the journal's repair.
const FaultDiskOnlyFrozen = "diskonly.frozen"

// planDiskOnly checks plan p of fork --disk-only of machine m: m runs, has
// a disk, its driver can switch disks under running vCPUs, and its agent
// can freeze the guest's filesystems (unless the request accepts a
// crash-consistent copy). It changes nothing.
func (mg *Manager) planDiskOnly(ctx context.Context, p *forkPlan, m *Machine) error {
	name := p.req.Source
	if m.State != StateRunning {
		return fmt.Errorf("fork %q: --disk-only forks a running machine, and it is %s (a stopped machine's children boot from its disk without it): %w", name, m.State, ErrInvalid)
	}
	if m.Spec.Disk == "" {
		return fmt.Errorf("fork %q: --disk-only needs a disk, and the machine has none: %w", name, ErrInvalid)
	}
	if _, ok := mg.Driver.(DiskForker); !ok {
		return fmt.Errorf("fork %q: --disk-only: driver %q cannot switch disks of a running machine: %w", name, mg.Driver.Name(), ErrUnsupported)
	}
	if m.Adopted != nil {
		// The children boot from the record, which cannot hold all of an
		// operator's domain definition (firmware, devices): as for the
		// children of a stopped adopted machine (checkForkSource).
		return fmt.Errorf("fork %q: --disk-only: the children would boot from vmfork's record, which cannot hold all of an adopted %s domain's definition; fork it live (without --disk-only): %w", name, m.Driver, ErrInvalid)
	}
	// The children boot from the record (Driver.Start), so the driver
	// must boot every disk of it, not only fork a running machine's.
	if err := mg.checkDiskSupport(m.Spec, p.req.DiskPolicies, true); err != nil {
		return fmt.Errorf("fork %q: --disk-only: %w", name, err)
	}
	p.mode = forkDiskOnly
	if p.req.CrashConsistent {
		return nil
	}
	if err := mg.checkFSFreeze(ctx, m); err != nil {
		return fmt.Errorf("fork %q: --disk-only: %w (--crash-consistent takes the disks unfrozen)", name, err)
	}
	return nil
}

// checkFSFreeze asks m's guest agent whether it can freeze and thaw
// filesystems; an error wraps ErrInvalid.
func (mg *Manager) checkFSFreeze(ctx context.Context, m *Machine) error {
	ctx, cancel := context.WithTimeout(ctx, agentProbeTimeout)
	defer cancel()
	ag, err := mg.Driver.Agent(ctx, m)
	if err != nil {
		return fmt.Errorf("no guest agent answers, so the filesystems cannot be frozen: %v: %w", err, ErrInvalid)
	}
	defer ag.Close()
	var info struct {
		Commands []struct {
			Name    string `json:"name"`
			Enabled bool   `json:"enabled"`
		} `json:"supported_commands"`
	}
	if err := ag.Execute(ctx, agentCmdInfo, nil, &info); err != nil {
		return fmt.Errorf("guest agent: %v: %w", err, ErrInvalid)
	}
	for _, want := range []string{agentCmdFreeze, agentCmdThaw} {
		if !slices.ContainsFunc(info.Commands, func(c struct {
			Name    string `json:"name"`
			Enabled bool   `json:"enabled"`
		}) bool {
			return c.Name == want && c.Enabled
		}) {
			return fmt.Errorf("the guest agent does not offer %s: %w", want, ErrInvalid)
		}
	}
	return nil
}

// freezeDiskOnly freezes src's disks into tpl with its vCPUs running:
// guest filesystems frozen (unless crashConsistent), disks switched in one
// transaction, filesystems thawed. It returns how long the filesystems
// were frozen. src's record is saved whatever happens after the switch.
func (mg *Manager) freezeDiskOnly(ctx context.Context, src *Machine, tpl *Template, crashConsistent bool) (window time.Duration, err error) {
	df := mg.Driver.(DiskForker) // planDiskOnly checked
	tpl.Paths.RAM, tpl.Paths.DevState, tpl.HasMemory = "", "", false
	var ag *qmp.Agent
	if !crashConsistent {
		if ag, err = mg.Driver.Agent(ctx, src); err != nil {
			return 0, fmt.Errorf("guest agent: %w", err)
		}
		defer ag.Close()
	}
	start := time.Now()
	if ag != nil {
		// Thawed on every path below, also when ctx ended: a filesystem
		// left frozen blocks every writer in the guest.
		defer func() {
			if terr := thaw(ctx, ag); terr != nil {
				err = errorsJoinOne(err, fmt.Errorf("thaw the guest's filesystems: %w", terr))
			}
			window = time.Since(start)
		}()
		fctx, cancel := context.WithTimeout(ctx, FSFreezeTimeout)
		var n int
		err = ag.Execute(fctx, agentCmdFreeze, nil, &n)
		cancel()
		if err != nil {
			return 0, fmt.Errorf("freeze the guest's filesystems: %w", err)
		}
		mg.Log.WithField("machine", src.Name).WithField("filesystems", n).Debug("guest filesystems frozen")
		Fault(FaultDiskOnlyFrozen, src.PID)
	}
	err = df.SwitchDisks(ctx, src, tpl)
	// Saved even on error: once the switch is done src runs on its new
	// overlays whatever failed after it.
	if serr := mg.Store.SaveMachine(src); serr != nil && err == nil {
		err = serr
	}
	if ag == nil {
		return 0, err // nothing was frozen
	}
	return time.Since(start), err // the deferred thaw adds its own time
}

// thaw thaws the guest's filesystems through ag, bounded by fsThawTimeout
// even when ctx has ended. Thawing a guest that is not frozen is a no-op.
func thaw(ctx context.Context, ag *qmp.Agent) error {
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), fsThawTimeout)
	defer cancel()
	return ag.Execute(tctx, agentCmdThaw, nil, nil)
}

// thawAfterCrash thaws machine src's guest, whose filesystems a disk-only
// fork killed in its freeze may have left frozen (repairFork).
func (mg *Manager) thawAfterCrash(ctx context.Context, src *Machine) error {
	actx, cancel := context.WithTimeout(ctx, agentProbeTimeout)
	defer cancel()
	ag, err := mg.Driver.Agent(actx, src)
	if err != nil {
		return err
	}
	defer ag.Close()
	if err := thaw(ctx, ag); err != nil {
		return err
	}
	mg.Log.WithField("machine", src.Name).Warn("thawed the filesystems of a guest an interrupted disk-only fork may have left frozen")
	return nil
}

// errorsJoinOne adds b to a: a alone when b is nil, b alone when a is.
func errorsJoinOne(a, b error) error {
	switch {
	case a == nil:
		return b
	case b == nil:
		return a
	}
	return fmt.Errorf("%w; and %w", a, b)
}
