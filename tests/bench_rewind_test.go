//go:build integration

package tests

import (
	"testing"
	"time"
)

// BenchmarkRewind rewinds a running test guest (256 MiB) to its checkpoint
// and, in the same round, forks one child of that checkpoint: both to
// READY (the command returns once the guest agent answers and the identity
// chain has run), timed around the CLI call. In the same round it reverts a
// libvirt domain of the same guest (kernel, initrd, disk, RAM, one vCPU,
// counter running) to an internal snapshot with memory, libvirt's own
// rewind (`virsh snapshot-create-as` once, then `virsh snapshot-revert`:
// QEMU's savevm/loadvm into the qcow2), until its guest agent answers a
// ping. It reports the medians and the ratios (the targets: rewind
// ≤ 1.25× fork, and faster than snapshot-revert).
//
//	VMFORK_BIN=$PWD/bin/vmfork VMFORK_GUEST=/var/cache/vmfork/guest \
//	  go test -tags integration -run '^$' -bench BenchmarkRewind -benchtime 1x ./tests/
//
// It needs libvirtd (scripts/libvirtd.sh) on qemu:///system.
func BenchmarkRewind(b *testing.B) {
	e := newEnv(b)
	e.boot("src")
	e.exec("src", "vmfork-counter", "start")
	dom := libvirtPeer(b, e)
	time.Sleep(time.Second)
	e.ok("checkpoint", "src", "--as", "cp1")
	virshOK(b, "snapshot-create-as", dom, "cp1")
	// Registered after libvirtPeer's cleanup, so it runs first: the
	// domain cannot be undefined while it has snapshots.
	b.Cleanup(func() { virsh(b, "snapshot-delete", dom, "cp1") })
	const rounds = 5
	var forks, rewinds, reverts []float64
	for range rounds {
		start := time.Now()
		e.ok("fork", "cp1", "kid")
		forks = append(forks, float64(time.Since(start).Microseconds())/1000)
		e.ok("rm", "kid", "--force")
		start = time.Now()
		e.ok("rewind", "src", "--to", "cp1")
		rewinds = append(rewinds, float64(time.Since(start).Microseconds())/1000)

		start = time.Now()
		virshOK(b, "snapshot-revert", dom, "cp1")
		if !eventually(3*time.Minute, func() bool {
			_, err := virsh(b, "qemu-agent-command", dom, `{"execute":"guest-ping"}`)
			return err == nil
		}) {
			b.Fatalf("the guest agent of %s does not answer after virsh snapshot-revert", dom)
		}
		reverts = append(reverts, msSince(start))
	}
	f, r, v := median(forks), median(rewinds), median(reverts)
	b.ReportMetric(f, "fork_ready_ms")
	b.ReportMetric(r, "rewind_ready_ms")
	b.ReportMetric(v, "snapshot_revert_agent_ms")
	b.ReportMetric(r/f, "rewind/fork")
	b.ReportMetric(v/r, "revert/rewind")
	b.Logf("fork %v ms, rewind %v ms, virsh snapshot-revert %v ms (medians of %d): rewind/fork %.2f, snapshot-revert/rewind %.2f",
		forks, rewinds, reverts, rounds, r/f, v/r)
}
