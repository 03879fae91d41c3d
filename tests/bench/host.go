package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"
)

// Host describes the machine a run measured.
type Host struct {
	CPUs          int       `json:"cpus"`
	CPUModel      string    `json:"cpu_model"`
	MemTotalBytes int64     `json:"mem_total_bytes"`
	Kernel        string    `json:"kernel"`
	QEMU          string    `json:"qemu"`
	Libvirt       string    `json:"libvirt,omitempty"`
	Accel         string    `json:"accel"`
	LoadAverage   string    `json:"load_average_at_start"`
	Started       time.Time `json:"started"`
	// KSM says whether the host merges identical pages: it would shrink the
	// guest-use fill (a repeated MiB) in every QEMU, libvirt's too.
	KSM bool `json:"ksm_running"`
}

func (h Host) String() string {
	s := fmt.Sprintf("%d CPUs (%s), %.1f GiB, Linux %s, %s, accel %s", h.CPUs, h.CPUModel,
		float64(h.MemTotalBytes)/(1<<30), h.Kernel, h.QEMU, h.Accel)
	if h.Libvirt != "" {
		s += ", " + h.Libvirt
	}
	return s + ", load average " + h.LoadAverage + " at start"
}

// Short is the host in a few words, for plots.
func (h Host) Short() string {
	qemu, _, _ := strings.Cut(h.QEMU, " (")
	s := fmt.Sprintf("%d CPUs (%s), %.0f GiB, %s, accel %s", h.CPUs, h.CPUModel, float64(h.MemTotalBytes)/(1<<30), qemu, h.Accel)
	if h.Libvirt != "" {
		s += ", " + h.Libvirt
	}
	return s
}

func describeHost(ctx context.Context, libvirtURI string) Host {
	h := Host{CPUs: runtime.NumCPU(), MemTotalBytes: meminfo("MemTotal"), Started: time.Now().UTC()}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				h.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if data, err := os.ReadFile("/sys/kernel/mm/ksm/run"); err == nil {
		h.KSM = strings.TrimSpace(string(data)) == "1"
	}
	if data, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		h.Kernel = strings.TrimSpace(string(data))
	}
	if data, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(data)); len(f) >= 3 {
			h.LoadAverage = strings.Join(f[:3], " ")
		}
	}
	if out, err := exec.CommandContext(ctx, "qemu-system-x86_64", "--version").Output(); err == nil {
		h.QEMU, _, _ = strings.Cut(strings.TrimSpace(string(out)), "\n")
		h.QEMU = strings.TrimPrefix(h.QEMU, "QEMU emulator version ")
		h.QEMU = "QEMU " + h.QEMU
	}
	if libvirtURI != "" {
		if out, err := exec.CommandContext(ctx, "virsh", "-c", libvirtURI, "version", "--daemon").Output(); err == nil {
			for _, l := range strings.Split(string(out), "\n") {
				if v, ok := strings.CutPrefix(strings.TrimSpace(l), "Running against daemon:"); ok {
					h.Libvirt = "libvirt " + strings.TrimSpace(v)
				}
			}
		}
	}
	return h
}
