package vmfork

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
)

// building is a received template's files under the import's staging
// names (import.go: staged), open while its chunks arrive: a chunk that
// travels is written where it goes as it arrives, checked in memory, and
// not read back; finishBuild fills in the chunks the store already had.
type building struct {
	st    *staged
	files []*os.File
	at    map[string][]placed // digest: where it goes
	done  map[string]bool     // digests written
}

type placed struct {
	f   *os.File
	off int64
}

// startBuild makes m's files, empty, at their sizes, under staging names
// (swept like an import's when their process is gone).
func (s *Store) startBuild(m *chunkManifest) (_ *building, err error) {
	b := &building{st: &staged{files: map[string]bool{}}, at: map[string][]placed{}, done: map[string]bool{}}
	defer func() {
		if err != nil {
			b.abort()
		}
	}()
	s.sweepStaging()
	if b.st.dir, err = os.MkdirTemp(filepath.Join(s.StateDir, dirTemplates), stagingPrefix("import")); err != nil {
		return nil, err
	}
	for _, f := range m.Files {
		var out *os.File
		if f.Name == archRAM {
			out, err = os.CreateTemp(s.MemDir, stagingPrefix("import")+"*"+ramSuffix+".tmp")
			if err == nil {
				b.st.ram = out.Name()
			}
		} else {
			out, err = os.OpenFile(filepath.Join(b.st.dir, f.Name), os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
		}
		if err != nil {
			return nil, err
		}
		b.files = append(b.files, out)
		if err := out.Truncate(f.Size); err != nil {
			return nil, fmt.Errorf("file %s: %w", f.Name, err)
		}
		for _, c := range f.Chunks {
			b.at[c.Digest] = append(b.at[c.Digest], placed{out, c.Off})
		}
		b.st.files[f.Name] = true
	}
	return b, nil
}

// write puts chunk d, checked, everywhere it goes.
func (b *building) write(d string, data []byte) error {
	for _, p := range b.at[d] {
		if _, err := p.f.WriteAt(data, p.off); err != nil {
			return fmt.Errorf("write %s: %w", p.f.Name(), err)
		}
	}
	b.done[d] = true
	return nil
}

// abort removes what is staged; after finishBuild it has nothing left to do.
func (b *building) abort() {
	for _, f := range b.files {
		f.Close()
	}
	b.files = nil
	b.st.remove()
}

// finishBuild writes the chunks the store already had (each checked again as
// it is read: a chunk damaged on this host's disk is refused, never used),
// syncs the files and installs them as template name (installImport:
// renames, then the record), with m's chunk map beside.
func (s *Store) finishBuild(ctx context.Context, b *building, m *chunkManifest, name string) (*Template, error) {
	cs := s.chunkStore()
	buf := make([]byte, chunkSize)
	for d := range b.at {
		if b.done[d] {
			continue
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		data, err := cs.read(d, buf)
		if err != nil {
			return nil, err
		}
		if err := b.write(d, data); err != nil {
			return nil, err
		}
	}
	for _, f := range b.files {
		if err := f.Sync(); err != nil {
			return nil, fmt.Errorf("sync %s: %w", f.Name(), err)
		}
		if err := f.Close(); err != nil {
			return nil, fmt.Errorf("close %s: %w", f.Name(), err)
		}
	}
	b.files = nil
	t := m.Template
	rec, err := s.installImport(&t, name, b.st)
	if err != nil {
		return nil, err
	}
	// The map makes this template a base for later transfers, and keeps
	// its chunks from gc.
	local := *m
	local.Template = *rec
	if err := writeJSON(filepath.Join(rec.Paths.Dir, fileChunkMap), &local); err != nil {
		return nil, err
	}
	return rec, nil
}
