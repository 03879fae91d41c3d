package sharedmem

// Delta chains (issue 27). A delta written with the source's writes tracked
// (track.go) used to start from a copy of the last delta, made before the
// pause: every delta was cumulative, all the source wrote since its base.
// Twenty forks of a source that writes 50 MiB between them held 50 + 100 +
// ... + 950 MiB of deltas (9.3 GiB) on a 3 GiB base, and each fork copied
// the last one first. A chained delta holds only what changed since the
// delta before it, which it names, and a child applies the chain oldest
// first: twenty forks hold the base once plus 19 x 50 MiB, and only the
// pages written since the last delta are copied before a pause (precopy,
// delta.go), the pause writing those written after that copy.
//
// What a chained delta holds: the pages written since the last delta's
// instant that are private now (the new data), and the pages some delta of
// the chain holds that are not private any more (QEMU discarded them: the
// guest sees the base there again, and an older delta would otherwise
// bring the old page back). Both are read from the paused source, so a
// discarded page is written with the base's bytes.
//
// The chain is kept by hard links: a delta template has a second name for
// every delta before it (<pages>.1 the oldest, ...), as it has for its base,
// so a chain stays whole whatever becomes of the templates it came from,
// and removing a template by id removes its links (Store's removeRAMDelta).
//
// maxDeltaDepth bounds the chain: a child writes every delta of its chain,
// and a page the guest writes before every fork is in all of them. At the
// bound the next delta starts from the chain merged into one file, copied
// before the pause (the cumulative way), and the chain starts again at one.

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
)

// maxDeltaDepth is the longest chain a freeze makes (docs/DELTAS.md,
// "Delta chains": at 16, 20 forks of 50 MiB each on a 3 GiB base hold 1.2x
// the base plus the deltas, against 1.3x at 8; a child of the deepest
// writes the 16 files, each page once unless rewritten between forks).
const maxDeltaDepth = 16

// MaxDeltaDepth is maxDeltaDepth, for callers that show it.
const MaxDeltaDepth = maxDeltaDepth

// ChainLink is the name of the i-th delta (1 the oldest) of the chain that
// delta file pages applies after.
func ChainLink(pages string, i int) string { return pages + "." + strconv.Itoa(i) }

// linkChain gives the delta being made a second name for each of chain's
// files (oldest first) and reads which pages they hold, before the pause.
func (p *Plan) linkChain(ctx context.Context, chain []string) error {
	ps := make(pageSet, (p.m.Size()/pageSize+63)/64)
	for i, c := range chain {
		link := ChainLink(p.req.Delta, i+1)
		if err := linkFile(c, link); err != nil {
			return err
		}
		p.chain = append(p.chain, link)
		runs, err := fileRuns(ctx, c, p.m.Offset, p.m.Size())
		if err != nil {
			return err
		}
		ps.add(runs)
	}
	p.chainHeld = ps
	return nil
}

// unlinkChain removes the chain's names of a delta that was not made.
func (p *Plan) unlinkChain() {
	for _, l := range p.chain {
		os.Remove(l)
	}
	p.chain, p.chainHeld = nil, nil
}

// linkFile gives file old the name new, read-only as every delta.
func linkFile(old, new string) error {
	if err := os.Link(old, new); err != nil {
		return fmt.Errorf("link RAM delta chain: %w", err)
	}
	return nil
}

// fileRuns is the data extents of file path as page runs from offset off.
func fileRuns(ctx context.Context, path string, off, size int64) ([]pageRun, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("RAM delta chain: %w", err)
	}
	defer f.Close()
	return dataRuns(ctx, f, off, size)
}

// writeChained writes, in the pause, the pages of a chained delta: those
// written since the last delta's instant that are private, and those the
// chain holds that are private no more.
func (p *Plan) writeChained(ctx context.Context) (int64, error) {
	written, err := writtenRuns(p.m)
	if err != nil {
		return 0, err
	}
	held := p.chainHeld.runs()
	private, err := privateRunsIn(ctx, p.m, append(slices.Clone(written), held...))
	if err != nil {
		return 0, err
	}
	ps := newPageSet(p.m.Size()/pageSize, private)
	changed, _ := ps.split(written)
	_, gone := ps.split(held)
	runs := append(changed, gone...)
	if len(runs) == 0 {
		return 0, nil
	}
	return copyRuns(ctx, p.m, p.delta, runs)
}

// copyChained copies, before the pause, the pages of written (taken since
// the last delta's instant) that are private now into the empty chained
// delta, and counts them as held: one discarded before the pause is then
// written with the base's bytes, as a chain file's page is (writeChained).
func (p *Plan) copyChained(ctx context.Context, written []pageRun) (int64, error) {
	private, err := privateRunsIn(ctx, p.m, written)
	if err != nil {
		return 0, err
	}
	changed, _ := newPageSet(p.m.Size()/pageSize, private).split(written)
	if len(changed) == 0 {
		return 0, nil
	}
	n, err := copyRuns(ctx, p.m, p.delta, changed)
	if err != nil {
		return n, err
	}
	p.chainHeld.add(changed)
	return n, nil
}

// Chain returns the names of the deltas a Delta freeze's delta applies
// after, oldest first (nil for one that stands on its base alone).
func (p *Plan) Chain() []string { return p.chain }

// add sets the pages of runs.
func (s pageSet) add(runs []pageRun) {
	for _, r := range runs {
		for i := r.first; i < r.first+r.n; i++ {
			s[i/64] |= 1 << (i % 64)
		}
	}
}

// runs returns s's pages as runs.
func (s pageSet) runs() []pageRun {
	var out []pageRun
	n := int64(len(s)) * 64
	for i := int64(0); i < n; {
		if s[i/64] == 0 && i%64 == 0 {
			i += 64
			continue
		}
		if !s.has(i) {
			i++
			continue
		}
		j := i
		for j < n && s.has(j) {
			j++
		}
		out = append(out, pageRun{i, j - i})
		i = j
	}
	return out
}

// MapTemplateChain is MapTemplate for a delta template whose delta applies
// after a chain of others: the child maps the base privately and gets the
// chain's pages, each from the newest delta holding it, mapped from the
// delta files or copied (overlay.go), before anything else runs.
func MapTemplateChain(ctx context.Context, mon Monitor, pid int, start, base string, deltas []string, sizeBytes int64) (ApplyStats, error) {
	if err := MapTemplate(ctx, mon, pid, start, base, sizeBytes); err != nil {
		return ApplyStats{}, err
	}
	m, err := baseMapping(pid, base, sizeBytes)
	if err != nil {
		return ApplyStats{}, err
	}
	return applyChain(ctx, mon, m, deltas)
}

// CompactChain writes base with each delta's pages over it, oldest first,
// into a new full RAM file dst (made read-only and renamed into place only
// when whole). Neither base nor a delta is written. It returns the bytes
// written.
func CompactChain(ctx context.Context, base string, deltas []string, dst string) (int64, error) {
	return compactFiles(ctx, append([]string{base}, deltas...), dst)
}
