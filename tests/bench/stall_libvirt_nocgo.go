//go:build !cgo

package bench

import (
	"context"
	"fmt"

	"github.com/vmfork/vmfork"
)

func (e *Env) pauseFloorLibvirt(ctx context.Context, name string) (float64, error) {
	return 0, fmt.Errorf("pause floor of %s: this vmfork was built without cgo, so without libvirt: %w", name, vmfork.ErrUnsupported)
}
