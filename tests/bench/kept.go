package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/vmfork/vmfork"
)

// The kept-template case of issue 6: the source's instant is kept once
// (vmfork template save) with a warm pool of one prestarted QEMU, and each
// round forks one child from the template. The child takes the pool's
// process, so its RUNNING covers only the device-state load and cont; the
// pool is refilled inside the fork call after the child is ready.

// keptPool is the pool size the peers keep: one child per round.
const keptPool = 1

func keptName(mem int) string { return fmt.Sprintf("kept%d", mem) }

// keepSource keeps src's current instant as template keptName(mem) and
// records the one-time pause. The caller gives the template up with unkeep.
func (e *Env) keepSource(ctx context.Context, sz *PeersSize, src string) error {
	e.announce("peers %s: keeping the source's instant as a template", memLabel(sz.MemoryMiB))
	t, err := e.mgr.Keep(ctx, vmfork.KeepRequest{Source: src, Name: keptName(sz.MemoryMiB), Pool: keptPool})
	if t != nil {
		sz.KeptPauseMS = t.PauseMS
	}
	if err != nil {
		return fmt.Errorf("keep %s: %w", src, err)
	}
	return nil
}

// unkeep gives the template up; its files go with its last child.
func (e *Env) unkeep(ctx context.Context, mem int) error {
	if _, err := e.mgr.Unkeep(ctx, keptName(mem)); err != nil && !errors.Is(err, vmfork.ErrNotFound) {
		return err
	}
	return nil
}

// forkKept forks one child of kept template name, reads its memory once it
// settled, and removes it. The pool member's memory is read before the fork:
// what a waiting process costs.
func (e *Env) forkKept(ctx context.Context, name string) (s Sample, err error) {
	idle, _ := e.poolIdlePSS(name)
	s, child, err := e.forkOne(ctx, name)
	if child != "" {
		defer func() { err = errors.Join(err, e.remove(context.WithoutCancel(ctx), child)) }()
	}
	// The template's pause was paid once, at the save (KeptPauseMS).
	s.PauseMS, s.PoolIdlePSSBytes = 0, idle
	return s, err
}

// poolIdlePSS reads the PSS of a waiting pool member of kept template name.
func (e *Env) poolIdlePSS(name string) (int64, error) {
	t, err := e.mgr.Store.FindKept(name)
	if err != nil {
		return 0, err
	}
	files, _ := filepath.Glob(filepath.Join(e.mgr.Store.StateDir, "pool", t.ID, "*", "member.json"))
	for _, f := range files {
		var m vmfork.Machine
		data, err := os.ReadFile(f)
		if err != nil || json.Unmarshal(data, &m) != nil || m.PID == 0 {
			continue
		}
		mem, err := readMemory(m.PID, t.Paths.RAM, int64(t.Spec.MemoryMiB)<<20)
		if err == nil {
			return mem.Total(), nil
		}
	}
	return 0, fmt.Errorf("kept template %s: no waiting pool member", name)
}
