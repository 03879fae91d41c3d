//go:build integration

package tests

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// serialTicks follows a serial log and records when (host time) each
// "vmfork-tick" line arrives: a guest whose vCPUs stop stops ticking, which a
// clock inside the guest (stopped with them) could not show.
type serialTicks struct {
	mu    sync.Mutex
	at    []time.Time
	stop  chan struct{}
	done  chan struct{}
	path  string
	off   int64
	carry []byte
}

func followTicks(t *testing.T, path string) *serialTicks {
	st := &serialTicks{stop: make(chan struct{}), done: make(chan struct{}), path: path}
	if fi, err := os.Stat(path); err == nil {
		st.off = fi.Size()
	}
	go func() {
		defer close(st.done)
		for {
			select {
			case <-st.stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			st.poll()
		}
	}()
	t.Cleanup(st.close)
	return st
}

func (st *serialTicks) poll() {
	f, err := os.Open(st.path)
	if err != nil {
		return
	}
	defer f.Close()
	buf := make([]byte, 1<<16)
	n, _ := f.ReadAt(buf, st.off)
	if n == 0 {
		return
	}
	now := time.Now()
	st.off += int64(n)
	data := append(st.carry, buf[:n]...)
	last := bytes.LastIndexByte(data, '\n')
	if last < 0 {
		st.carry = data
		return
	}
	st.carry = append([]byte(nil), data[last+1:]...)
	k := bytes.Count(data[:last+1], []byte("vmfork-tick"))
	st.mu.Lock()
	for range k {
		st.at = append(st.at, now)
	}
	st.mu.Unlock()
}

func (st *serialTicks) close() {
	select {
	case <-st.stop:
	default:
		close(st.stop)
		<-st.done
	}
}

// maxGap returns the longest time between ticks that arrived within [from,
// to], counting from the last tick before from, and how many arrived.
func (st *serialTicks) maxGap(from, to time.Time) (time.Duration, int) {
	st.mu.Lock()
	defer st.mu.Unlock()
	var prev time.Time
	var gap time.Duration
	n := 0
	for _, a := range st.at {
		if a.Before(from) {
			prev = a
			continue
		}
		if a.After(to) {
			break
		}
		n++
		if !prev.IsZero() && a.Sub(prev) > gap {
			gap = a.Sub(prev)
		}
		prev = a
	}
	return gap, n
}

// fork --disk-only of a running source: its vCPUs never stop (a ticker on its
// serial console, timed on the host, shows no stall beyond the
// filesystem-freeze window), the children boot fresh and see the source's
// files, synced or not (the freeze flushes them), and a child's writes stay
// its own. The source has two extra disks, switched in the same
// transaction: the children's cow one holds what the source wrote before
// the fork, their fresh one is empty.
func TestForkDiskOnly(t *testing.T) {
	parallel(t)
	e := newEnv(t)
	dir := t.TempDir()
	extra := func(name string) string {
		p := filepath.Join(dir, name)
		if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", p, "1M").CombinedOutput(); err != nil {
			t.Fatalf("qemu-img create %s: %v: %s", p, err, out)
		}
		return p
	}
	src := e.boot("src", "--disk", "id=more,file="+extra("more.qcow2"), "--disk", "id=scratch,file="+extra("scratch.qcow2")+",fork=fresh")
	const more, scratch = "/dev/vdb", "/dev/vdc"
	readDev := func(m, dev string) string {
		t.Helper()
		return strings.TrimSpace(e.exec(m, "sh", "-c", "sync; echo 3 >/proc/sys/vm/drop_caches; dd if="+dev+" bs=16 count=1 2>/dev/null | tr -d '\\000'"))
	}
	for dev, s := range map[string]string{more: "MORE-SRC", scratch: "SCRATCH-SRC"} {
		// Synced: a raw device's page cache is no filesystem's, which
		// the freeze would flush.
		e.exec("src", "sh", "-c", "printf "+s+" | dd of="+dev+" conv=notrunc 2>/dev/null && sync")
	}
	e.exec("src", "vmfork-counter", "start")
	e.exec("src", "sh", "-c", "echo synced >/data/synced.txt && sync && echo unsynced >/data/unsynced.txt")
	e.exec("src", "sh", "-c", `setsid sh -c 'while :; do echo vmfork-tick; usleep 20000; done >/dev/ttyS0 2>&1' </dev/null >/dev/null 2>&1 &`)
	ticks := followTicks(t, src.Serial)
	time.Sleep(500 * time.Millisecond)
	c0 := e.counter("src")

	var res struct {
		forkJSON
		DiskOnly   bool    `json:"disk_only"`
		FSFrozenMS float64 `json:"fs_frozen_ms"`
	}
	start := time.Now()
	r := e.ok("fork", "src", "--disk-only", "--count", "2", "--json")
	end := time.Now()
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil {
		t.Fatalf("fork --json: %v\n%s", err, r.stdout)
	}
	gap, n := ticks.maxGap(start, end)
	t.Logf("disk-only fork: %.0f ms in all, filesystems frozen %.1f ms, pause_ms %.1f; source's serial ticker: %d ticks, longest gap %v",
		ms(end.Sub(start)), res.FSFrozenMS, res.PauseMS, n, gap.Round(time.Millisecond))
	if !res.DiskOnly || res.PauseMS != 0 || res.FSFrozenMS <= 0 || len(res.Children) != 2 {
		t.Fatalf("fork result %+v: want disk-only, no pause, a freeze window, 2 children", res)
	}
	// The children's cold boots load this 2-core TCG host: a tick may come
	// late, but never stop for long.
	if n == 0 || gap > time.Duration(res.FSFrozenMS)*time.Millisecond+1500*time.Millisecond {
		t.Errorf("the source's ticker stalled %v (%d ticks) during the fork, over the %.1f ms freeze window + 1.5 s", gap, n, res.FSFrozenMS)
	}
	if c1 := e.counter("src"); c1 <= c0 {
		t.Errorf("the source's counter went from %d to %d across the fork, want it to run on", c0, c1)
	}
	// The source's filesystem is thawed: a write and sync finish.
	e.exec("src", "sh", "-c", "echo after >/data/after.txt && sync")

	for _, c := range res.Children {
		if got := strings.TrimSpace(e.exec(c.Name, "cat", "/data/synced.txt", "/data/unsynced.txt")); got != "synced\nunsynced" {
			t.Errorf("child %s sees %q, want the source's files", c.Name, got)
		}
		if got := e.vmfork("exec", c.Name, "--", "test", "-e", "/run/counter"); got.code == 0 {
			t.Errorf("child %s has the source's /run/counter: it continued instead of booting", c.Name)
		}
		if got := strings.TrimSpace(e.exec(c.Name, "hostname")); got != c.Name {
			t.Errorf("child %s's hostname is %q, want its own", c.Name, got)
		}
		if got := e.vmfork("exec", c.Name, "--", "test", "-e", "/data/after.txt"); got.code == 0 {
			t.Errorf("child %s sees the source's write after the fork", c.Name)
		}
		if got := readDev(c.Name, more); got != "MORE-SRC" {
			t.Errorf("child %s's cow disk reads %q, want the source's MORE-SRC", c.Name, got)
		}
		if got := readDev(c.Name, scratch); got != "" {
			t.Errorf("child %s's fresh disk reads %q, want an empty disk", c.Name, got)
		}
	}
	if got := readDev("src", scratch); got != "SCRATCH-SRC" {
		t.Errorf("the source's fresh disk reads %q, want SCRATCH-SRC", got)
	}
	// The view the children booted from is a clean file system: the
	// freeze left it consistent (e2fsck on the host, read-only, of the
	// template's frozen boot disk, flattened).
	raw := filepath.Join(dir, "frozen.raw")
	frozen := filepath.Join(e.stateDir, "templates", res.Template, "disk.qcow2")
	if out, err := exec.Command("qemu-img", "convert", "-U", "-O", "raw", frozen, raw).CombinedOutput(); err != nil {
		t.Fatalf("flatten the frozen disk %s: %v: %s", frozen, err, out)
	}
	if out, err := exec.Command("e2fsck", "-fn", raw).CombinedOutput(); err != nil {
		t.Errorf("e2fsck -fn of the disk-only fork's frozen disk: %v\n%s", err, out)
	} else {
		t.Logf("e2fsck of the frozen disk: clean")
	}
	if os.Getenv("VMFORK_DISKONLY_COMPARE") != "" {
		// For docs/BENCHMARKS.md, off in CI: a live fork of the same
		// source, its pause and the ticker's longest gap.
		var live forkJSON
		start := time.Now()
		e.jsonOK(&live, "fork", "src", "--count", "1")
		end := time.Now()
		gap, n := ticks.maxGap(start, end)
		t.Logf("live fork: %.0f ms in all, pause_ms %.1f; source's serial ticker: %d ticks, longest gap %v",
			ms(end.Sub(start)), live.PauseMS, n, gap.Round(time.Millisecond))
	}
	c1 := res.Children[0].Name
	e.exec(c1, "sh", "-c", "echo mine >/data/child.txt && sync")
	for _, m := range []string{"src", res.Children[1].Name} {
		if got := e.vmfork("exec", m, "--", "test", "-e", "/data/child.txt"); got.code == 0 {
			t.Errorf("%s sees %s's write", m, c1)
		}
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
