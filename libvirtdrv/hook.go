package libvirtdrv

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"

	"libvirt.org/go/libvirtxml"
)

// Host paths of a libvirt 9.0 system daemon (Debian 12).
const (
	DefaultQEMUConf = "/etc/libvirt/qemu.conf"
	DefaultHookDir  = "/etc/libvirt/hooks/qemu.d"
	// defaultMemoryBackingDir is libvirt's built-in memory_backing_dir.
	defaultMemoryBackingDir = "/var/lib/libvirt/qemu/ram"
	// HookName is the drop-in vmfork installs; drop-ins run in name order
	// after the main qemu hook.
	HookName = "50-vmfork"
)

var memoryBackingDirLine = regexp.MustCompile(`^\s*memory_backing_dir\s*=\s*"([^"]*)"\s*(#.*)?$`)

// MemoryBackingDir returns the directory under which libvirt, configured by
// qemuConf, makes each domain's RAM directory. libvirt 9.0 appends
// "libvirt/qemu" to a memory_backing_dir set in qemu.conf (observed:
// "/dev/shm" gives /dev/shm/libvirt/qemu/<id>-<name>/pc.ram), while its
// built-in default is used as it is.
func MemoryBackingDir(qemuConf string) (string, error) {
	v, err := configuredMemoryBackingDir(qemuConf)
	if err != nil || v == "" {
		return defaultMemoryBackingDir, err
	}
	return strings.TrimSuffix(v, "/") + "/libvirt/qemu", nil
}

// configuredMemoryBackingDir returns memory_backing_dir as qemu.conf sets it,
// or "" when it is not set. The last setting wins, as in libvirt's parser.
func configuredMemoryBackingDir(qemuConf string) (string, error) {
	f, err := os.Open(qemuConf)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read %s: %w", qemuConf, err)
	}
	defer f.Close()
	v := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if m := memoryBackingDirLine.FindStringSubmatch(sc.Text()); m != nil {
			v = m[1]
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("read %s: %w", qemuConf, err)
	}
	return v, nil
}

// HookOptions configure Hook.
type HookOptions struct {
	// QEMUConf is libvirtd's qemu.conf (memory_backing_dir).
	QEMUConf string
	// Reap, when set, is called at "release end" of a fork child: it must
	// start, and not wait for, whatever removes the child from vmfork's
	// store once libvirt has forgotten the domain (`vmfork libvirt reap`).
	Reap func(ReapRequest) error
}

// ReapRequest names a fork child whose domain has ended.
type ReapRequest struct {
	URI      string
	StateDir string
	MemDir   string
	Machine  string
	UUID     string
}

// Hook handles one call of libvirt's qemu hook, `<hook> NAME OPERATION
// SUB-OPERATION EXTRA` with the domain XML on stdin (libvirt docs/hooks.rst),
// for fork children only (domains whose metadata names a template RAM file):
//
//   - "start begin", which libvirt 9.0 runs after it has made and labelled
//     the domain's RAM directory and before it executes QEMU
//     (qemuProcessLaunch; reference libvirt-children.md §3): link the
//     template RAM file to the path QEMU will open, for a child that maps
//     its RAM private; never for one that maps it shared;
//   - "release end", after QEMU is gone and libvirt has cleaned up: hand the
//     child to Reap, so a child destroyed with virsh leaves nothing behind.
//
// It never calls libvirt: the daemon waits for the hook, so a call back
// would deadlock. Every other domain and call is left alone.
func Hook(args []string, stdin io.Reader, opt HookOptions) error {
	if len(args) < 3 {
		return nil
	}
	op := args[1] + " " + args[2]
	if op != "start begin" && op != "release end" {
		return nil
	}
	data, err := io.ReadAll(stdin)
	if err != nil {
		return fmt.Errorf("hook %s: read domain XML: %w", args[0], err)
	}
	d := &libvirtxml.Domain{}
	if err := d.Unmarshal(string(data)); err != nil {
		return fmt.Errorf("hook %s: parse domain XML: %w", args[0], err)
	}
	md := metadataOf(d)
	if md == nil || md.TemplateRAM == "" && md.MappedRAM == "" {
		return nil
	}
	if op == "release end" {
		if opt.Reap == nil || md.URI == "" {
			return nil
		}
		// The record lives in <state-dir>/machines/<name> (vmfork.Store) and
		// a template's RAM file in the mem dir.
		return opt.Reap(ReapRequest{
			URI: md.URI, StateDir: filepath.Dir(filepath.Dir(md.MachineDir)), MemDir: filepath.Dir(md.TemplateRAM + md.MappedRAM),
			Machine: md.Machine, UUID: d.UUID,
		})
	}
	if mb := d.MemoryBacking; md.TemplateRAM == "" || mb != nil && mb.MemoryAccess != nil && mb.MemoryAccess.Mode == "shared" {
		// QEMU maps this RAM file shared: a template linked there would be
		// written by the child. QEMU makes a fresh file, and vmfork remaps
		// the child privately onto the template before it runs (StartChild).
		return nil
	}
	if d.ID == nil {
		return fmt.Errorf("hook %s: domain XML has no id", d.Name)
	}
	if err := checkTemplate(md); err != nil {
		return fmt.Errorf("hook %s: %w", d.Name, err)
	}
	dir, err := MemoryBackingDir(opt.QEMUConf)
	if err != nil {
		return fmt.Errorf("hook %s: %w", d.Name, err)
	}
	if err := linkRAM(md.TemplateRAM, ramFile(dir, *d.ID, d.Name)); err != nil {
		return fmt.Errorf("hook %s: %w", d.Name, err)
	}
	return nil
}

// checkTemplate makes sure the file the hook is asked to link is a vmfork
// template's RAM: the file of template md.Template, which has a record in
// the state dir md.MachineDir belongs to. The hook runs as root and the
// metadata is only as trustworthy as whoever defined the domain, so it links
// nothing else as guest RAM.
func checkTemplate(md *Metadata) error {
	if md.Template == "" || filepath.Base(md.TemplateRAM) != md.Template+".ram" || !filepath.IsAbs(md.TemplateRAM) {
		return fmt.Errorf("template RAM %q is not the RAM file of template %q", md.TemplateRAM, md.Template)
	}
	record := filepath.Join(filepath.Dir(filepath.Dir(md.MachineDir)), "templates", md.Template, "manifest.json")
	if _, err := os.Stat(record); err != nil {
		return fmt.Errorf("template %q has no record: %w", md.Template, err)
	}
	return nil
}

// linkRAM makes dst name the template file: a hard link where both are on
// one filesystem (the template's owner and mode then apply as they are),
// else a symlink, which QEMU follows inside its mount namespace (libvirt
// keeps /dev/shm there). dst's directory must exist: libvirt made it, and if
// it did not, the RAM path was computed wrongly and the start must fail.
func linkRAM(template, dst string) error {
	st, err := os.Stat(template)
	if err != nil {
		return fmt.Errorf("template RAM: %w", err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("template RAM %s is not a regular file", template)
	}
	dir := dst[:strings.LastIndexByte(dst, '/')]
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return fmt.Errorf("libvirt's RAM directory %s is missing (is memory_backing_dir in qemu.conf what libvirtd runs with? restart libvirtd after changing it): %v", dir, err)
	}
	if err := os.Remove(dst); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("replace %s: %w", dst, err)
	}
	err = os.Link(template, dst)
	if errors.Is(err, syscall.EXDEV) {
		err = os.Symlink(template, dst)
	}
	if err != nil {
		return fmt.Errorf("link template RAM: %w", err)
	}
	return nil
}

// linkedTo reports whether path is the file template: a hard link to it or a
// symlink naming it. A child whose RAM path is anything else would run on
// zeroed memory, so StartChild checks this before loading device state.
func linkedTo(path, template string) bool {
	if target, err := os.Readlink(path); err == nil {
		return target == template
	}
	a, err := os.Stat(path)
	if err != nil {
		return false
	}
	b, err := os.Stat(template)
	return err == nil && os.SameFile(a, b)
}
