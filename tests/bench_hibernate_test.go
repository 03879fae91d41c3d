//go:build integration

package tests

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// BenchmarkHibernate hibernates and resumes a running test guest (256 MiB,
// a counter running) with vmfork, and in the same round does the same to a
// libvirt domain of the same guest (kernel, initrd, disk, RAM, one vCPU)
// with `virsh managedsave` and `virsh start`: each phase timed around the
// CLI call, vmfork's resume to READY (the command returns once the guest
// agent answers and the clock step ran), libvirt's start until its guest
// agent answers a ping. It reports the medians, and the files on disk:
// vmfork's sparse RAM file plus device state against libvirt's save file
// (size and allocated blocks).
//
//	VMFORK_BIN=$PWD/bin/vmfork VMFORK_GUEST=/var/cache/vmfork/guest \
//	  go test -tags integration -run '^$' -bench BenchmarkHibernate -benchtime 1x ./tests/
//
// It needs libvirtd (scripts/libvirtd.sh) on qemu:///system.
func BenchmarkHibernate(b *testing.B) {
	e := newEnv(b)
	e.boot("src")
	e.exec("src", "vmfork-counter", "start")
	dom := libvirtPeer(b, e)
	time.Sleep(2 * time.Second)

	const rounds = 5
	var hib, res, save, start []float64
	var vmforkFile, vmforkAlloc, virshFile, virshAlloc int64
	for range rounds {
		t0 := time.Now()
		var h hibernateJSON
		e.jsonOK(&h, "hibernate", "src")
		hib = append(hib, msSince(t0))
		vmforkFile, vmforkAlloc = fileSizes(b, h.RAMFile, filepath.Join(filepath.Dir(h.RAMFile), "devstate"))
		t0 = time.Now()
		e.ok("resume", "src")
		res = append(res, msSince(t0))

		t0 = time.Now()
		virshOK(b, "managedsave", dom)
		save = append(save, msSince(t0))
		virshFile, virshAlloc = fileSizes(b, filepath.Join("/var/lib/libvirt/qemu/save", dom+".save"))
		t0 = time.Now()
		virshOK(b, "start", dom)
		if !eventually(3*time.Minute, func() bool {
			_, err := virsh(b, "qemu-agent-command", dom, `{"execute":"guest-ping"}`)
			return err == nil
		}) {
			b.Fatalf("the guest agent of %s does not answer after virsh start", dom)
		}
		start = append(start, msSince(t0))
	}
	mib := func(n int64) float64 { return float64(n) / (1 << 20) }
	b.ReportMetric(median(hib), "hibernate_ms")
	b.ReportMetric(median(res), "resume_ready_ms")
	b.ReportMetric(median(save), "managedsave_ms")
	b.ReportMetric(median(start), "virsh_start_agent_ms")
	b.ReportMetric(mib(vmforkAlloc), "vmfork_file_MiB")
	b.ReportMetric(mib(virshAlloc), "libvirt_file_MiB")
	row := func(k, v string) { fmt.Printf("%-44s %14s\n", k, v) }
	fmt.Printf("\nhibernate/resume vs virsh managedsave/start, test guest 256 MiB, %d rounds (medians)\n", rounds)
	row("vmfork hibernate", fmt.Sprintf("%.0f ms", median(hib)))
	row("virsh managedsave", fmt.Sprintf("%.0f ms", median(save)))
	row("vmfork resume (to READY)", fmt.Sprintf("%.0f ms", median(res)))
	row("virsh start (to agent)", fmt.Sprintf("%.0f ms", median(start)))
	row("vmfork RAM file + devstate (allocated)", fmt.Sprintf("%.1f MiB", mib(vmforkAlloc)))
	row("  (apparent size)", fmt.Sprintf("%.1f MiB", mib(vmforkFile)))
	row("libvirt save file (allocated)", fmt.Sprintf("%.1f MiB", mib(virshAlloc)))
	row("  (apparent size)", fmt.Sprintf("%.1f MiB", mib(virshFile)))
	b.Logf("hibernate %v, resume %v, managedsave %v, virsh start %v (ms)", hib, res, save, start)
}

func msSince(t time.Time) float64 { return float64(time.Since(t).Microseconds()) / 1000 }

// fileSizes returns the apparent and allocated sizes of paths, summed.
func fileSizes(b *testing.B, paths ...string) (size, alloc int64) {
	b.Helper()
	for _, p := range paths {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			b.Fatalf("stat %s: %v", p, err)
		}
		size, alloc = size+st.Size, alloc+st.Blocks*512
	}
	return size, alloc
}

// libvirtPeer defines and starts a persistent libvirt domain of e's guest
// (managedsave needs a persistent one), with the guest's counter running,
// and returns its name; it is destroyed and undefined with its managed
// save when the benchmark ends.
func libvirtPeer(b *testing.B, e *env) string {
	b.Helper()
	sum := sha256.Sum256([]byte(e.stateDir))
	dom := "h" + hex.EncodeToString(sum[:3]) + "-peer"
	dir := b.TempDir()
	// libvirt's QEMU runs as another user: the temp root must be searchable.
	for d := dir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
	disk := filepath.Join(dir, "peer.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-b", e.guest.Disk, "-F", "qcow2", disk).CombinedOutput(); err != nil {
		b.Fatalf("qemu-img create: %v: %s", err, out)
	}
	os.Chmod(disk, 0o666)
	xml := filepath.Join(dir, dom+".xml")
	if err := os.WriteFile(xml, []byte(operatorXML(dom, e.guest, disk, "", "")), 0o644); err != nil {
		b.Fatal(err)
	}
	virshOK(b, "define", xml)
	b.Cleanup(func() {
		virsh(b, "destroy", dom)
		virsh(b, "undefine", dom, "--managed-save")
	})
	virshOK(b, "start", dom)
	if !eventually(3*time.Minute, func() bool {
		_, err := virsh(b, "qemu-agent-command", dom, `{"execute":"guest-ping"}`)
		return err == nil
	}) {
		b.Fatalf("the guest agent of %s does not answer", dom)
	}
	virshOK(b, "qemu-agent-command", dom, `{"execute":"guest-exec","arguments":{"path":"/bin/vmfork-counter","arg":["start"]}}`)
	return dom
}
