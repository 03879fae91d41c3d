package bench

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/qmp"
)

// Guest use: a warmed guest (a VDI desktop at noon, an AI agent's machine
// mid-run) holds most of its RAM, while the test guest touches about
// 130 MiB. Before the rounds, each source guest gets that much RAM filled
// with non-zero data: QEMU's migration (so virsh save) skips zero pages, and
// a fill of zeros would measure nothing. The fill is a tmpfs file in the
// guest (tmpfs pages stay in guest RAM; the guest has no swap), written by
// busybox through the guest agent: 1 MiB from /dev/urandom once, then
// catenated N-1 times, which takes seconds under TCG where urandom for the
// whole size would take minutes. The repeated MiB is honest as long as the
// host does not merge identical pages (KSM); Host reports whether it does.

// GuestUse is how much of its RAM each source guest holds in use: Percent of
// the guest's RAM, or MiB. The zero value leaves the guests as they boot.
type GuestUse struct {
	Percent float64 `json:"percent,omitempty"`
	MiB     int     `json:"mib,omitempty"`
}

// ParseGuestUse reads --guest-use: "0" (none), a percentage of each guest's
// RAM such as "75%", or a size such as "1536M" or "1G".
func ParseGuestUse(s string) (GuestUse, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "0" {
		return GuestUse{}, nil
	}
	if p, ok := strings.CutSuffix(s, "%"); ok {
		v, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil || v < 0 || v >= 100 {
			return GuestUse{}, fmt.Errorf("guest use %q: want a percentage from 0 to below 100, such as 75%%: %w", s, vmfork.ErrInvalid)
		}
		return GuestUse{Percent: v}, nil
	}
	mib, err := vmfork.ParseMemory(s)
	if err != nil {
		return GuestUse{}, fmt.Errorf("guest use %q: want a percentage such as 75%% or a size such as 1536M: %w", s, vmfork.ErrInvalid)
	}
	return GuestUse{MiB: mib}, nil
}

// String is the flag's form of g.
func (g GuestUse) String() string {
	switch {
	case g.Percent > 0:
		return strconv.FormatFloat(g.Percent, 'f', -1, 64) + "%"
	case g.MiB > 0:
		return memLabel(g.MiB)
	}
	return "0"
}

// MiBFor is the fill for a guest of memMiB, in whole MiB. A fixed size of
// at least the guest's RAM is an error: the guest would run out of memory.
func (g GuestUse) MiBFor(memMiB int) (int, error) {
	switch {
	case g.Percent > 0:
		return int(float64(memMiB) * g.Percent / 100), nil
	case g.MiB >= memMiB:
		return 0, fmt.Errorf("guest use %s does not fit a %s guest: %w", memLabel(g.MiB), memLabel(memMiB), vmfork.ErrInvalid)
	}
	return g.MiB, nil
}

// fillReserveMiB is what the guest must keep available besides the fill:
// its agent, the counter and the identity chain run in it.
const fillReserveMiB = 48

// Meminfo is the guest's /proc/meminfo, in bytes.
type Meminfo struct {
	TotalBytes     int64 `json:"mem_total_bytes"`
	FreeBytes      int64 `json:"mem_free_bytes"`
	AvailableBytes int64 `json:"mem_available_bytes"`
	ShmemBytes     int64 `json:"shmem_bytes"`
}

func parseGuestMeminfo(data []byte) (Meminfo, error) {
	m := Meminfo{TotalBytes: parseMeminfo(data, "MemTotal"), FreeBytes: parseMeminfo(data, "MemFree"),
		AvailableBytes: parseMeminfo(data, "MemAvailable"), ShmemBytes: parseMeminfo(data, "Shmem")}
	if m.TotalBytes == 0 || m.AvailableBytes == 0 {
		return m, fmt.Errorf("guest's /proc/meminfo has no MemTotal or MemAvailable: %.80q", data)
	}
	return m, nil
}

// Fill is what a source guest got before the rounds.
type Fill struct {
	Source       string  `json:"source"` // the method whose source it is
	Guest        string  `json:"guest"`  // machine or domain name
	RequestedMiB int     `json:"requested_mib"`
	WrittenBytes int64   `json:"written_bytes"` // the guest's Shmem growth
	DurationMS   float64 `json:"duration_ms"`
	Before       Meminfo `json:"before"`
	After        Meminfo `json:"after"`
}

// guestRunner runs argv in a guest through its agent, to its end.
type guestRunner func(ctx context.Context, argv []string) (qmp.ExecStatus, error)

// managerRunner runs commands in machine name of mg.
func managerRunner(mg *vmfork.Manager, name string) guestRunner {
	return func(ctx context.Context, argv []string) (qmp.ExecStatus, error) {
		return mg.Exec(ctx, name, vmfork.ExecRequest{Argv: argv})
	}
}

// domainRunner runs commands in a plain libvirt domain, whose agent socket
// libvirt owns, through `virsh qemu-agent-command`.
func (e *Env) domainRunner(name string) guestRunner {
	a := qmp.NewAgent(virshAgent{e: e, domain: name})
	return func(ctx context.Context, argv []string) (qmp.ExecStatus, error) {
		return a.Run(ctx, qmp.ExecRequest{Path: argv[0], Args: argv[1:], CaptureOutput: true})
	}
}

// virshAgent is a qmp.Transport over virsh: one process per command.
type virshAgent struct {
	e      *Env
	domain string
}

func (v virshAgent) Command(ctx context.Context, req []byte) ([]byte, error) {
	out, err := v.e.virsh(ctx, false, "qemu-agent-command", v.domain, string(req), "--timeout", "30")
	return []byte(strings.TrimSpace(out)), err
}

func (v virshAgent) Close() error { return nil }

func guestMeminfo(ctx context.Context, run guestRunner) (Meminfo, error) {
	st, err := run(ctx, []string{"/bin/cat", "/proc/meminfo"})
	if err != nil {
		return Meminfo{}, err
	}
	if st.ExitCode != 0 || st.Signal != 0 {
		return Meminfo{}, fmt.Errorf("cat /proc/meminfo: exit %d, signal %d: %s", st.ExitCode, st.Signal, st.Stderr)
	}
	return parseGuestMeminfo(st.Stdout)
}

// fillScript mounts a tmpfs of the fill's size on /fill and writes $1 MiB
// of non-zero data into it. The arguments after $1 are the seed's path,
// repeated: one cat process writes the whole file (process creation is
// slow under TCG).
const fillScript = `set -e
mkdir -p /fill
mount -t tmpfs -o size=$(($1 + 1))m,mode=0700 vmfork-fill /fill
head -c 1048576 /dev/urandom >/fill/seed
shift
cat "$@" >/fill/data
`

// fillGuest fills mib MiB of guest (a source of method) with non-zero data
// and checks with the guest's own figures that its RAM holds it.
func fillGuest(ctx context.Context, run guestRunner, method Method, guest string, mib int) (Fill, error) {
	f := Fill{Source: string(method), Guest: guest, RequestedMiB: mib}
	var err error
	if f.Before, err = guestMeminfo(ctx, run); err != nil {
		return f, fmt.Errorf("guest use in %s: %w", guest, err)
	}
	if avail := int(f.Before.AvailableBytes >> 20); mib > avail-fillReserveMiB {
		return f, fmt.Errorf("guest use %d MiB does not fit %s: it has %d MiB available of %d MiB, and keeps %d MiB for itself: %w",
			mib, guest, avail, f.Before.TotalBytes>>20, fillReserveMiB, vmfork.ErrInvalid)
	}
	argv := []string{"/bin/sh", "-c", fillScript, "fill", strconv.Itoa(mib)}
	for range mib - 1 {
		argv = append(argv, "/fill/seed")
	}
	start := time.Now()
	st, err := run(ctx, argv)
	f.DurationMS = ms(time.Since(start))
	if err != nil {
		return f, fmt.Errorf("guest use in %s: %w", guest, err)
	}
	if st.ExitCode != 0 || st.Signal != 0 {
		return f, fmt.Errorf("guest use in %s: fill script: exit %d, signal %d: %s", guest, st.ExitCode, st.Signal, bytes.TrimSpace(st.Stderr))
	}
	if f.After, err = guestMeminfo(ctx, run); err != nil {
		return f, fmt.Errorf("guest use in %s: %w", guest, err)
	}
	f.WrittenBytes = f.After.ShmemBytes - f.Before.ShmemBytes
	// The guest's own count, not the script's exit code, says the pages are
	// there (a tmpfs page is counted in Shmem while it is in RAM).
	if want := int64(mib) << 20; f.WrittenBytes < want-want/50 {
		return f, fmt.Errorf("guest use in %s: Shmem grew by %s, want %d MiB", guest, fmtBytes(f.WrittenBytes), mib)
	}
	return f, nil
}
