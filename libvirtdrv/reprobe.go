//go:build cgo

package libvirtdrv

import (
	"context"
	"fmt"
	"time"
)

// ReprobeThreshold is how long a domain-capabilities call may take before
// Reprobes calls it a fresh probe of QEMU: a cached answer takes milliseconds,
// a probe seconds.
const ReprobeThreshold = 1500 * time.Millisecond

// Reprobes asks libvirt for its domain capabilities twice and reports, in one
// line, when both answers took a probe's time: libvirt's capability cache is
// then judged stale on every call. It returns "" when the cache holds.
func (d *Driver) Reprobes(ctx context.Context) (string, error) {
	var took [2]time.Duration
	for i := range took {
		start := time.Now()
		if err := bounded(ctx, "virConnectGetDomainCapabilities", func() error {
			_, err := d.conn.GetDomainCapabilities("", domainArch, "", "", 0)
			return err
		}); err != nil {
			return "", fmt.Errorf("ask libvirt for its domain capabilities: %w", err)
		}
		took[i] = time.Since(start)
	}
	if took[0] < ReprobeThreshold || took[1] < ReprobeThreshold {
		return "", nil
	}
	return fmt.Sprintf("libvirt re-probes QEMU on every call (domain capabilities took %.1f s, then %.1f s): "+
		"check `vmfork libvirt check`'s /dev/kvm line, then restart libvirtd",
		took[0].Seconds(), took[1].Seconds()), nil
}

// bounded runs call, which the libvirt bindings cannot cancel, and gives up
// waiting for it when ctx ends, naming the call. The call itself goes on in
// its goroutine until libvirt answers.
func bounded(ctx context.Context, name string, call func() error) error {
	done := make(chan error, 1)
	go func() { done <- call() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("%s: no answer from libvirt: %w", name, ctx.Err())
	}
}
