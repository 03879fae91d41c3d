package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/overlay"
	"github.com/vmfork/vmfork/qemudrv"
	"github.com/vmfork/vmfork/qemustate"
	"github.com/vmfork/vmfork/qmp"
)

// bareQEMU is a QEMU the harness starts itself from a fork child's template
// with -incoming defer: the same argv vmfork would use, and nothing of
// vmfork around it (no records, no locks, no identity chain). It is the
// floor a fork child is compared to.
type bareQEMU struct {
	pid    int
	dir    string
	m      vmfork.Machine
	tpl    *vmfork.Template
	mon    *qmp.Monitor
	done   chan struct{}
	spawnT time.Time
}

// spawnFromTemplate starts a bare QEMU with the configuration of fork child
// child, mapping the child's template RAM share=off, on an overlay of the
// template's frozen disk made before QEMU starts. It returns once QMP
// answers; the caller kills it.
func (e *Env) spawnFromTemplate(ctx context.Context, child, label string) (q *bareQEMU, err error) {
	c, err := e.mgr.Store.LoadMachine(child)
	if err != nil {
		return nil, err
	}
	tpl, err := e.mgr.Store.LoadTemplate(c.Template)
	if err != nil {
		return nil, err
	}
	// A bare QEMU maps one full RAM file: a delta template (a live fork of
	// a source that already maps a frozen file, vmfork's delta.go) is
	// compacted first, outside the timed part.
	if err := e.mgr.Store.CompactRAM(ctx, tpl); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(e.dir, label+"-")
	if err != nil {
		return nil, err
	}
	m := *c
	m.Name = label
	m.Spec.Ports = nil
	m.Paths = vmfork.Paths{
		Dir: dir, Disk: filepath.Join(dir, "disk.qcow2"), QMP: filepath.Join(dir, "qmp.sock"),
		QGA: filepath.Join(dir, "qga.sock"), Serial: filepath.Join(dir, "serial.log"),
		Log: filepath.Join(dir, "qemu.log"), RAM: tpl.Paths.RAM, RAMShared: false,
	}
	q = &bareQEMU{dir: dir, m: m, tpl: tpl, done: make(chan struct{})}
	defer func() {
		if err != nil {
			q.kill(e)
		}
	}()
	if tpl.Paths.Disk != "" {
		if err := overlay.Create(ctx, tpl.Paths.Disk, m.Paths.Disk); err != nil {
			return q, err
		}
	}
	logf, err := os.Create(m.Paths.Log)
	if err != nil {
		return q, err
	}
	defer logf.Close()
	q.spawnT = time.Now()
	cmd := exec.Command("qemu-system-x86_64", qemudrv.Argv(&m, qemudrv.ArgvOptions{Incoming: true, DevicesOnly: tpl.Manifest.DevStateFormat != ""})...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group: a Ctrl-C in the terminal is for the harness,
	// which then kills this QEMU itself on the way out.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		close(q.done)
		return q, fmt.Errorf("start QEMU: %w", err)
	}
	q.pid = cmd.Process.Pid
	e.track(q.pid, dir)
	go func() {
		cmd.Wait()
		close(q.done)
	}()
	for {
		dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		q.mon, err = qmp.Dial(dctx, m.Paths.QMP)
		cancel()
		if err == nil {
			return q, nil
		}
		select {
		case <-q.done:
			return q, fmt.Errorf("%s QEMU exited before QMP answered (see %s)", label, m.Paths.Log)
		case <-ctx.Done():
			return q, ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// setCaps turns on x-ignore-shared, which both ends of a template load need.
func (q *bareQEMU) setCaps(ctx context.Context) error {
	return qemustate.SetIgnoreShared(ctx, q.mon)
}

// load streams the template's device state in through a passed fd and
// waits until the load completed: vmfork's own sequence (qemustate.LoadDeviceState).
func (q *bareQEMU) load(ctx context.Context) error {
	return qemustate.LoadDeviceState(ctx, q.mon, "st", q.tpl.Paths.DevState, time.Millisecond, nil)
}

// waitAgent waits until the guest agent answers a ping, as vmfork's own
// readiness check does.
func (q *bareQEMU) waitAgent(ctx context.Context) error {
	return waitAgentSocket(ctx, q.m.Paths.QGA, q.done)
}

func waitAgentSocket(ctx context.Context, path string, done <-chan struct{}) error {
	for {
		actx, cancel := context.WithTimeout(ctx, 3*time.Second)
		a, err := qmp.DialAgent(actx, path)
		if err == nil {
			err = a.Ping(actx)
			a.Close()
		}
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-done:
			return errors.New("QEMU exited before its guest agent answered")
		case <-ctx.Done():
			return fmt.Errorf("wait for guest agent: %w (last error: %v)", ctx.Err(), err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func (q *bareQEMU) memory() (Memory, error) {
	return readMemory(q.pid, q.tpl.Paths.RAM, int64(q.m.Spec.MemoryMiB)<<20)
}

// kill ends the QEMU and removes its files.
func (q *bareQEMU) kill(e *Env) {
	if q.mon != nil {
		q.mon.Close()
	}
	if q.pid > 0 {
		syscall.Kill(q.pid, syscall.SIGKILL)
		<-q.done
		e.untrack(q.pid)
	}
	os.RemoveAll(q.dir)
}

// floor measures a bare QEMU from child's template: spawn, QMP, x-ignore-shared,
// load, cont (running), then the agent's answer (ready). The overlay is made
// before the clock starts.
func (e *Env) floor(ctx context.Context, child string) (s Sample, err error) {
	q, err := e.spawnFromTemplate(ctx, child, "floor")
	if err != nil {
		return s, fmt.Errorf("floor: %w", err)
	}
	defer q.kill(e)
	start := q.spawnT
	qmpUp := time.Since(start)
	t := time.Now()
	if err := q.setCaps(ctx); err != nil {
		return s, fmt.Errorf("floor: %w", err)
	}
	if err := q.load(ctx); err != nil {
		return s, fmt.Errorf("floor: load device state: %w", err)
	}
	loaded := time.Since(t)
	t = time.Now()
	if err := q.mon.Cont(ctx); err != nil {
		return s, fmt.Errorf("floor: cont: %w", err)
	}
	contD := time.Since(t)
	s.RunningMS = ms(time.Since(start))
	t = time.Now()
	if err := q.waitAgent(ctx); err != nil {
		return s, fmt.Errorf("floor: %w", err)
	}
	s.ReadyMS = ms(time.Since(start))
	s.AgentMS = s.ReadyMS
	s.Phases = Phases{QEMUStartMS: ms(qmpUp), LoadMS: ms(loaded), ContMS: ms(contD), AgentMS: ms(time.Since(t))}
	return e.finishSample(ctx, s, q.memory)
}

// finishSample lets the child settle and reads its memory.
func (e *Env) finishSample(ctx context.Context, s Sample, read func() (Memory, error)) (Sample, error) {
	if err := e.settle(ctx); err != nil {
		return s, err
	}
	m, err := read()
	s.Memory, s.PSSBytes = m, m.Total()
	return s, err
}

// pidMemory reads a process's plain PSS by kind.
func pidMemory(pid int, memMiB int) func() (Memory, error) {
	return func() (Memory, error) { return readMemory(pid, "", int64(memMiB)<<20) }
}
