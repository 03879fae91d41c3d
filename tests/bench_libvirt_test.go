//go:build integration

package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/libvirtdrv"
	"github.com/vmfork/vmfork/overlay"
	"github.com/vmfork/vmfork/tests/bench"
)

// BenchmarkForkLibvirt is BenchmarkFork for the libvirt driver: it forks a
// running test guest (256 MiB), a libvirt domain, one child per round and
// prints the same table. Its floor is libvirt's own cost of starting that
// child, measured in the same round: a plain `virsh create --paused` of the
// same domain XML (start hook and -incoming defer included, no device state
// loaded, no resume), so the ratio says what vmfork adds to a libvirt start.
//
//	VMFORK_BIN=$PWD/bin/vmfork VMFORK_GUEST=$PWD/tests/guest/out \
//	  go test -tags integration -run '^$' -bench BenchmarkForkLibvirt -benchtime 8x ./tests/
//
// VMFORK_BENCH_JSON=FILE also writes the figures as JSON.
func BenchmarkForkLibvirt(b *testing.B) {
	d := newDriverEnv(b, []string{"--connect", libvirtURI})
	src := d.bootGuest(d.n("src"))
	d.run(src.Name, "vmfork-counter", "start")
	time.Sleep(2 * time.Second)

	fork := func(name string) (row forkBenchRow, pid int) {
		var res forkJSON
		d.cliJSON(&res, "fork", src.Name, name)
		c := res.Children[0]
		row.PauseMS, row.RunningMS, row.ReadyMS = res.PauseMS, c.RunningMS, c.ReadyMS
		row.DiskAtBirth = diskAtBirth(b, d.stateDir, name)
		return row, c.PID
	}
	var virshMS []float64
	floor := func(child string, round int) float64 {
		ms := libvirtFloor(b, d, child, round)
		virshMS = append(virshMS, timeMS(b, "virsh", "-c", libvirtURI, "uri"))
		return ms
	}
	rows, children := forkRounds(b, func(i int) string { return d.n("c" + strconv.Itoa(i)) }, fork, floor)
	srcRSS, pss := childMemory(b, d.machines()[src.Name].PID, children)

	// The floor here is libvirt's create of the child's domain.
	md := mediansOf(rows)
	pause, running, ready, create, disk := md.PauseMS, md.RunningMS, md.ReadyMS, md.FloorMS, md.DiskKiB
	virshBase, childPSS := bench.Median(virshMS), bench.Median(pss)

	b.ReportMetric(pause, "pause-ms")
	b.ReportMetric(running, "child-running-ms")
	b.ReportMetric(ready, "child-ready-ms")
	b.ReportMetric(create, "libvirt-create-ms")
	b.ReportMetric(running/create, "running/libvirt-create")
	b.ReportMetric(childPSS, "child-pss-MiB")
	b.ReportMetric(disk, "child-disk-KiB")

	row := func(k, v string) { fmt.Printf("%-42s %10s\n", k, v) }
	fmt.Printf("\nvmfork fork -c %s, test guest 256 MiB, %d rounds (medians), accel %s\n", libvirtURI, len(rows), libvirtAccel(d, src.Name))
	row("source pause", fmt.Sprintf("%.1f ms", pause))
	row("child running (vmfork)", fmt.Sprintf("%.1f ms", running))
	row("floor (virsh create --paused, same XML)", fmt.Sprintf("%.1f ms", create))
	row("  of which virsh start + connect", fmt.Sprintf("%.1f ms", virshBase))
	row("child running / floor", fmt.Sprintf("%.2fx", running/create))
	row("child running / (floor - virsh)", fmt.Sprintf("%.2fx", running/(create-virshBase)))
	row("child ready (agent answers)", fmt.Sprintf("%.1f ms", ready))
	row("child PSS", fmt.Sprintf("%.1f MiB", childPSS))
	row("source RSS", fmt.Sprintf("%.1f MiB", srcRSS))
	row("child PSS / source RSS", fmt.Sprintf("%.2f", childPSS/srcRSS))
	row("child disk at birth", fmt.Sprintf("%.0f KiB", disk))

	writeBenchJSON(b, map[string]any{
		"driver": "libvirt", "guest_memory_mib": 256, "rounds": rows, "child_pss_mib": pss, "source_rss_mib": srcRSS,
		"median_pause_ms": pause, "median_child_running_ms": running, "median_child_ready_ms": ready,
		"median_libvirt_create_paused_ms": create, "median_virsh_connect_ms": virshBase,
	})
}

// libvirtFloor times `virsh create --paused` of the domain XML vmfork gives a
// child of child's template, under another name and on an overlay of its
// own made before the clock starts, then destroys that domain.
func libvirtFloor(b *testing.B, d *driverEnv, child string, round int) float64 {
	b.Helper()
	var rec vmfork.Machine
	data, err := os.ReadFile(filepath.Join(d.stateDir, "machines", child, "machine.json"))
	if err != nil || json.Unmarshal(data, &rec) != nil {
		b.Fatalf("read %s's record: %v", child, err)
	}
	tplDir := filepath.Join(d.stateDir, "templates", rec.Template)
	srcXML, err := os.ReadFile(filepath.Join(tplDir, libvirtdrv.FileSourceXML))
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	m := rec
	m.Name = d.n("floor" + strconv.Itoa(round))
	m.Paths = vmfork.Paths{Dir: dir, Disk: filepath.Join(dir, "disk.qcow2"), Serial: filepath.Join(dir, "serial.log")}
	if err := overlay.Create(b.Context(), filepath.Join(tplDir, "disk.qcow2"), m.Paths.Disk); err != nil {
		b.Fatal(err)
	}
	// The template RAM makes the start hook link it, as for a child; no URI,
	// so its release starts no reaper.
	md := libvirtdrv.Metadata{Machine: m.Name, MachineDir: filepath.Join(d.stateDir, "machines", m.Name), Template: rec.Template, TemplateRAM: rec.Paths.RAM}
	def, err := libvirtdrv.ChildXML(string(srcXML), &m, md)
	if err != nil {
		b.Fatal(err)
	}
	x, err := def.Marshal()
	if err != nil {
		b.Fatal(err)
	}
	f := filepath.Join(dir, "domain.xml")
	if err := os.WriteFile(f, []byte(x), 0o600); err != nil {
		b.Fatal(err)
	}
	ms := timeMS(b, "virsh", "-c", libvirtURI, "create", "--paused", f)
	virshOK(b, "destroy", m.Name)
	return ms
}

// timeMS runs a command and returns how long it took.
func timeMS(b *testing.B, name string, args ...string) float64 {
	b.Helper()
	start := time.Now()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		b.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
	return float64(time.Since(start).Microseconds()) / 1000
}

func libvirtAccel(d *driverEnv, name string) string {
	var rec vmfork.Machine
	data, err := os.ReadFile(filepath.Join(d.stateDir, "machines", name, "machine.json"))
	if err != nil || json.Unmarshal(data, &rec) != nil {
		return "?"
	}
	return rec.Accel
}
