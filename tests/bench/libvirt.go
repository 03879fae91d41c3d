package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/template"
	"time"

	"github.com/vmfork/vmfork/overlay"
)

// The libvirt comparator is what a libvirt user has today to clone a
// running VM with its memory: `virsh save` (the domain stops), then
// `virsh restore` of a copy of the save file. A restored copy cannot run
// next to its original (same name and uuid, and restore's ABI check refuses
// a changed one), so the restore of the copy is timed as the per-child cost
// and the restored domain carries on as the source of the next round.
// Everything goes through the virsh CLI, as a user would run it.

// domainXML is a plain libvirt domain of the test guest with the device set
// of a vmfork machine: q35, qemu64, direct kernel boot, the data disk as a
// qcow2 overlay, a user-mode virtio NIC and the guest agent channel. No
// balloon: vmfork has none either.
var domainXML = template.Must(template.New("domain").Parse(`<domain type='qemu'>
  <name>{{.Name}}</name>
  <memory unit='MiB'>{{.MemoryMiB}}</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='{{.MachineType}}'>hvm</type>
    <kernel>{{.Kernel}}</kernel>
    <initrd>{{.Initrd}}</initrd>
    <cmdline>{{.Append}}</cmdline>
  </os>
  <features><acpi/><apic/></features>
  <cpu mode='custom' match='exact'><model fallback='forbid'>qemu64</model></cpu>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>{{.Emulator}}</emulator>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source file='{{.Disk}}'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <controller type='usb' model='none'/>
    <interface type='user'><model type='virtio'/></interface>
    <channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>
    <serial type='file'><source path='{{.Serial}}'/></serial>
    <memballoon model='none'/>
  </devices>
</domain>
`))

type domainConfig struct {
	Name, MachineType, Kernel, Initrd, Append, Emulator, Disk, Serial string
	MemoryMiB                                                         int
}

// libvirtDomain is one transient domain of the run.
type libvirtDomain struct {
	name   string
	dir    string
	memMiB int
}

// virsh runs virsh against the run's libvirt URI. Commands that change a
// domain run to their end even when ctx is cancelled: libvirtd would finish
// the job anyway, and cleanup must find the domain in a settled state. They
// run in their own process group so a terminal Ctrl-C does not abort them
// half-way.
func (e *Env) virsh(ctx context.Context, mutating bool, args ...string) (string, error) {
	if mutating {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), 10*time.Minute)
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, "virsh", append([]string{"-q", "-c", e.cfg.LibvirtURI}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = 5 * time.Second
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &limitedWriter{w: &errb, n: 4096}
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("failed to run %v: stderr=%#q: %w", cmd.Args, strings.TrimSpace(errb.String()), err)
	}
	return out.String(), nil
}

type limitedWriter struct {
	w io.Writer
	n int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if l.n > 0 {
		k := min(len(p), l.n)
		l.w.Write(p[:k])
		l.n -= k
	}
	return len(p), nil
}

// createDomain starts a transient domain of the test guest and returns once
// its agent answers, with that time (libvirt's cold boot).
func (e *Env) createDomain(ctx context.Context, memMiB int, machineType string) (*libvirtDomain, time.Duration, error) {
	name := fmt.Sprintf("vmfork-bench-%d-%d", os.Getpid(), memMiB)
	dir := filepath.Join(e.dir, "libvirt-"+strconv.Itoa(memMiB))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, 0, err
	}
	// Copies, not the guest dir's files: libvirt's DAC driver chowns what a
	// domain uses, and the guest dir is shared with other users of the tree.
	cfg := domainConfig{
		Name: name, MachineType: machineType, MemoryMiB: memMiB, Append: e.cmdline(guestAppend),
		Kernel: filepath.Join(dir, "vmlinuz"), Initrd: filepath.Join(dir, "initrd.gz"),
		Disk: filepath.Join(dir, "disk.qcow2"), Serial: filepath.Join(dir, "serial.log"),
	}
	var err error
	if cfg.Emulator, err = exec.LookPath("qemu-system-x86_64"); err != nil {
		return nil, 0, err
	}
	base := filepath.Join(dir, "data.qcow2")
	for src, dst := range map[string]string{e.guest.Kernel: cfg.Kernel, e.guest.Initrd: cfg.Initrd, e.guest.Disk: base} {
		if err := copyFile(src, dst); err != nil {
			return nil, 0, err
		}
	}
	if err := overlay.Create(ctx, base, cfg.Disk); err != nil {
		return nil, 0, err
	}
	// vmfork runs under umask 077 (cmd/vmfork/main.go), but libvirt checks
	// that its QEMU user can reach the domain's files before it chowns them.
	for _, p := range []string{dir, cfg.Kernel, cfg.Initrd, base, cfg.Disk} {
		mode := os.FileMode(0o644)
		if p == dir {
			mode = 0o755
		}
		if err := os.Chmod(p, mode); err != nil {
			return nil, 0, err
		}
	}
	xmlPath := filepath.Join(dir, "domain.xml")
	var b bytes.Buffer
	if err := domainXML.Execute(&b, cfg); err != nil {
		return nil, 0, err
	}
	if err := os.WriteFile(xmlPath, b.Bytes(), 0o644); err != nil {
		return nil, 0, err
	}
	d := &libvirtDomain{name: name, dir: dir, memMiB: memMiB}
	e.mu.Lock()
	e.domains[name] = true // before create: cleanup must find it whatever happens next
	e.mu.Unlock()
	start := time.Now()
	if _, err := e.virsh(ctx, true, "create", xmlPath); err != nil {
		return nil, 0, err
	}
	if err := e.waitDomainAgent(ctx, name, 5*time.Minute); err != nil {
		return nil, 0, err
	}
	return d, time.Since(start), nil
}

// waitDomainAgent polls guest-ping through libvirt until the agent answers.
// Each poll is a virsh process (about 10-20 ms), which bounds the
// resolution of this comparator's "ready".
func (e *Env) waitDomainAgent(ctx context.Context, name string, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		_, err := e.virsh(ctx, false, "qemu-agent-command", name, `{"execute":"guest-ping"}`, "--timeout", "1")
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("domain %s: guest agent does not answer: %w (last error: %v)", name, ctx.Err(), err)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// domainMemory reads the memory of a domain's QEMU, found by libvirt's pid
// file.
func domainMemory(name string, memMiB int) (Memory, error) {
	data, err := os.ReadFile("/run/libvirt/qemu/" + name + ".pid")
	if err != nil {
		return Memory{}, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		return Memory{}, fmt.Errorf("pid file of %s: %w", name, err)
	}
	return readMemory(pid, "", int64(memMiB)<<20)
}

// saveRestore clones the domain the libvirt way: save (the domain stops),
// copy the save file, restore the copy, wait for the agent. The restored
// domain is the source of the next round.
func (e *Env) saveRestore(ctx context.Context, d *libvirtDomain) (s Sample, err error) {
	saved, copied := filepath.Join(d.dir, "save.img"), filepath.Join(d.dir, "copy.img")
	defer os.Remove(saved)
	defer os.Remove(copied)
	start := time.Now()
	if _, err := e.virsh(ctx, true, "save", d.name, saved); err != nil {
		return s, err
	}
	saveD := time.Since(start)
	t := time.Now()
	if err := copyFile(saved, copied); err != nil {
		return s, err
	}
	copyD := time.Since(t)
	if st, err := os.Stat(saved); err == nil {
		s.SaveFileBytes = st.Size()
	}
	if err := ctx.Err(); err != nil {
		// Saved, a transient domain is gone: nothing left to destroy.
		return s, err
	}
	t = time.Now()
	if _, err := e.virsh(ctx, true, "restore", copied); err != nil {
		return s, err
	}
	restoreD := time.Since(t)
	s.RunningMS = ms(restoreD)
	if err := e.waitDomainAgent(ctx, d.name, 2*time.Minute); err != nil {
		return s, err
	}
	s.ReadyMS = ms(time.Since(t))
	s.AgentMS = s.ReadyMS
	s.PauseMS = ms(saveD + restoreD)
	s.WallMS = ms(time.Since(start))
	s.Phases = Phases{SaveMS: ms(saveD), CopyMS: ms(copyD), RestoreMS: ms(restoreD), AgentMS: s.ReadyMS - s.RunningMS}
	return e.finishSample(ctx, s, func() (Memory, error) { return domainMemory(d.name, d.memMiB) })
}

// destroyDomain destroys a transient domain (it is then gone). A domain that
// does not exist is no error.
func (e *Env) destroyDomain(ctx context.Context, name string) error {
	out, err := e.virsh(ctx, false, "list", "--all", "--name")
	if err != nil {
		return err
	}
	for _, l := range strings.Fields(out) {
		if l == name {
			if _, err := e.virsh(ctx, true, "destroy", name); err != nil {
				return err
			}
		}
	}
	e.mu.Lock()
	delete(e.domains, name)
	e.mu.Unlock()
	return nil
}

func copyFile(src, dst string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
	}()
	if _, err := io.Copy(out, in); err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	return nil
}
