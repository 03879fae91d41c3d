package qemudrv

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/overlay"
	"github.com/vmfork/vmfork/qmp"
)

var _ vmfork.LayerDropper = (*Driver)(nil)

// DropLayer implements vmfork.LayerDropper for a running machine: a QMP
// block-stream job copies layer, and every layer above it, into the top
// image, whose backing then becomes layer's own backing. The layers stay
// untouched for the children that still read them; the machine just stops
// reading them.
func (d *Driver) DropLayer(ctx context.Context, m *vmfork.Machine, layer string) error {
	if !d.procs.alive(m.PID, m.Paths.QMP) {
		return fmt.Errorf("machine %q: %w", m.Name, vmfork.ErrNotRunning)
	}
	chain, k, err := overlay.FindLayer(m.Paths.Disk, layer)
	if err != nil || k <= 0 {
		return err // nil when not below the top (any more)
	}
	mon, err := qmp.Dial(ctx, m.Paths.QMP, qmp.WithLogger(d.log.WithField("machine", m.Name)))
	if err != nil {
		return fmt.Errorf("drop layer: %w", err)
	}
	defer mon.Close()
	top, err := topNode(ctx, mon)
	if err != nil {
		return err
	}
	job := fmt.Sprintf("vmfork-stream-%x", time.Now().UnixNano())
	args := map[string]any{"job-id": job, "device": top}
	if k+1 < len(chain) {
		base := chain[k+1].Path
		node, err := nodeOf(ctx, mon, base)
		if err != nil {
			return err
		}
		// QEMU would record the base under the name it opened it by, which
		// may be a name vmfork removes later; record the chain's own name.
		args["base-node"], args["backing-file"] = node, base
	}
	events, err := mon.Events(ctx)
	if err != nil {
		return err
	}
	if err := mon.Execute(ctx, "block-stream", args, nil); err != nil {
		return fmt.Errorf("drop layer %s: %w", layer, err)
	}
	if err := waitJob(ctx, mon, events, job); err != nil {
		return err
	}
	if chain, err := overlay.Chain(m.Paths.Disk); err == nil {
		overlay.RemoveUnchained(m.Paths.Dir, chain)
	}
	return nil
}

// waitJob waits for block job id to finish; an error in its
// BLOCK_JOB_COMPLETED event fails it.
func waitJob(ctx context.Context, mon *qmp.Monitor, events <-chan qmp.Event, id string) error {
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				return fmt.Errorf("block job %s: %w", id, qmp.ErrClosed)
			}
			if ev.Name != "BLOCK_JOB_COMPLETED" && ev.Name != "BLOCK_JOB_CANCELLED" {
				continue
			}
			var data struct {
				Device string `json:"device"`
				Error  string `json:"error"`
			}
			if err := json.Unmarshal(ev.Data, &data); err != nil || data.Device != id {
				continue
			}
			if ev.Name == "BLOCK_JOB_CANCELLED" {
				return fmt.Errorf("block job %s was cancelled", id)
			}
			if data.Error != "" {
				return fmt.Errorf("block job %s: %s", id, data.Error)
			}
			return nil
		case <-ctx.Done():
			return fmt.Errorf("block job %s: %w", id, ctx.Err())
		}
	}
}

// nodeOf finds the QEMU node whose image is the file at path. QEMU knows
// images by the names it opened them with, which differ from the names in
// the chain's headers (hard links), so files are matched by inode.
func nodeOf(ctx context.Context, mon *qmp.Monitor, path string) (string, error) {
	var nodes []struct {
		NodeName string `json:"node-name"`
		Drv      string `json:"drv"`
		File     string `json:"file"`
	}
	if err := mon.Execute(ctx, "query-named-block-nodes", map[string]any{"flat": true}, &nodes); err != nil {
		return "", fmt.Errorf("query block nodes: %w", err)
	}
	for _, n := range nodes {
		if n.Drv != "file" && overlay.SameFile(n.File, path) {
			return n.NodeName, nil
		}
	}
	return "", fmt.Errorf("no QEMU block node for %s", path)
}
