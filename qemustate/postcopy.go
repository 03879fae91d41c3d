package qemustate

import (
	"context"
	"fmt"
	"time"

	"github.com/vmfork/vmfork/qmp"
)

// Postcopy states (QEMU 7.2 MigrationStatus) a live fork sees: a link that
// dies in postcopy leaves both ends paused, waiting for a migrate-recover
// that vmfork never sends.
const (
	MigrationPostcopyActive = "postcopy-active"
	MigrationPostcopyPaused = "postcopy-paused"
)

// PostcopyPoll is how often a live fork asks QEMU where its migration is.
const PostcopyPoll = 5 * time.Millisecond

// PostcopyStats is what Postcopy reports: the last status, the RAM bytes
// sent, and the times from migrate until postcopy ran and until the whole
// RAM was there.
type PostcopyStats struct {
	Status                string
	Bytes                 int64
	SwitchoverMS, TotalMS float64
}

// Postcopy runs a live fork's migration on the loaded QEMU behind ex, its
// capabilities already set (postcopy-ram on, x-ignore-shared off): bounded
// to maxBandwidth bytes/s when > 0, migrate to uri, precopy for precopyFor
// (tests hold it there), then postcopy, so that the other end runs as soon
// as the device state is there. started is called once it may run (at the
// switch, or at the end if the migration completed before it). It returns
// once the migration completed; a failed, cancelled or paused one is
// ErrMigrationFailed with QEMU's reason. Both drivers' LoadedTemplate.Migrate.
func Postcopy(ctx context.Context, ex qmp.Executor, uri string, maxBandwidth int64, precopyFor time.Duration, started func()) (PostcopyStats, error) {
	var st PostcopyStats
	if bps := maxBandwidth; bps > 0 {
		if err := ex.Execute(ctx, "migrate-set-parameters", map[string]any{"max-bandwidth": bps, "max-postcopy-bandwidth": bps}, nil); err != nil {
			return st, fmt.Errorf("migrate: bandwidth: %w", err)
		}
	}
	start := time.Now()
	if err := ex.Execute(ctx, CmdMigrate, map[string]string{"uri": uri}, nil); err != nil {
		return st, fmt.Errorf("migrate: %w", err)
	}
	if precopyFor > 0 {
		select {
		case <-ctx.Done():
			return st, ctx.Err()
		case <-time.After(precopyFor):
		}
	}
	if err := ex.Execute(ctx, "migrate-start-postcopy", nil, nil); err != nil {
		return st, fmt.Errorf("migrate: start postcopy: %w", err)
	}
	ms := func() float64 { return float64(time.Since(start).Microseconds()) / 1000 }
	switched := false
	for {
		var info MigrationInfo
		if err := ex.Execute(ctx, CmdQueryMigrate, nil, &info); err != nil {
			return st, fmt.Errorf("migrate: %w", err)
		}
		st.Status, st.Bytes = info.Status, info.RAM.Transferred
		switch info.Status {
		case MigrationPostcopyActive:
			if !switched {
				switched = true
				st.SwitchoverMS = ms()
				if started != nil {
					started()
				}
			}
		case MigrationCompleted:
			st.TotalMS = ms()
			if !switched && started != nil {
				started()
			}
			return st, nil
		case MigrationFailed, MigrationCancelled, MigrationPostcopyPaused:
			desc := info.ErrorDesc
			if desc == "" {
				desc = "the link to the other end broke"
			}
			return st, fmt.Errorf("migrate: %s: %s: %w", info.Status, desc, ErrMigrationFailed)
		}
		select {
		case <-ctx.Done():
			return st, fmt.Errorf("migrate (%s): %w", info.Status, ctx.Err())
		case <-time.After(PostcopyPoll):
		}
	}
}
