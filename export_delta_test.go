package vmfork

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// keptFakeAs makes keptFake's template kept as name, its RAM edited by edit.
func keptFakeAs(t *testing.T, mg *Manager, name string, edit func(ram *os.File)) *Template {
	t.Helper()
	tpl := keptFake(t, mg)
	if edit != nil {
		f, err := os.OpenFile(tpl.Paths.RAM, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		edit(f)
		f.Close()
	}
	tpl.Name = name
	if err := mg.Store.WriteTemplate(tpl); err != nil {
		t.Fatal(err)
	}
	return tpl
}

func otherHost(t *testing.T) *Manager {
	return NewManager(newTestStore(t), &hostDriver{&linkDriver{fakeDriver: newFakeDriver()}, "7.2.0"}, nil)
}

// noneLeft fails when mg's store holds a template kept as name or a
// staged file.
func noneLeft(t *testing.T, mg *Manager, name, after string) {
	t.Helper()
	if _, err := mg.Store.FindKept(name); err == nil {
		t.Errorf("%s: template %q was made", after, name)
	}
	if st, _ := filepath.Glob(filepath.Join(mg.Store.StateDir, dirTemplates, ".import*")); len(st) != 0 {
		t.Errorf("%s: left %v", after, st)
	}
	if st, _ := filepath.Glob(filepath.Join(mg.Store.MemDir, ".import*")); len(st) != 0 {
		t.Errorf("%s: left %v", after, st)
	}
}

func TestExportDelta(t *testing.T) {
	ctx := t.Context()
	from, _ := newTestManager(t)
	// A page only the base has: v2's chunk must be rebuilt over the
	// base's, not over zeros.
	keptFakeAs(t, from, "golden-old", func(ram *os.File) { ram.WriteAt(bytes.Repeat([]byte{9}, 4096), 1<<20+8192) })
	noise := make([]byte, 64<<10)
	rand.Read(noise)
	v2 := keptFakeAs(t, from, "golden-v2", func(ram *os.File) {
		ram.WriteAt([]byte("a page that changed"), 1<<20) // in chunk 0: one page travels
		ram.WriteAt(noise, 5<<20)                         // a chunk the base has not
	})
	to := otherHost(t)
	if _, sendErr, recvErr := transferPair(t, from, to, "golden-old", ""); sendErr != nil || recvErr != nil {
		t.Fatalf("push of the base: %v, %v", sendErr, recvErr)
	}
	dir := t.TempDir()
	file := filepath.Join(dir, "v2.vmd")
	res, err := from.Export(ctx, ExportRequest{Name: "golden-v2", Base: "golden-old", File: file})
	if err != nil {
		t.Fatal(err)
	}
	if res.ChunksStored != 2 || res.Base != "golden-old" || res.Chunks < 4 {
		t.Errorf("delta export %+v: want 2 chunks carried of %d", res, res.Chunks)
	}
	// One changed page and 64 KiB of noise, compressed frames, a header.
	if res.Archive > 64<<10+4096+16<<10 {
		t.Errorf("delta archive of %d bytes, want about 68 KiB", res.Archive)
	}
	archive, _ := os.ReadFile(file)

	// Refusals, each before anything is written.
	if _, err := from.Export(ctx, ExportRequest{Name: "golden-v2", Base: "golden-old", File: file}); !errors.Is(err, ErrExists) {
		t.Errorf("export over an existing file: %v, want ErrExists", err)
	}
	if _, err := from.Export(ctx, ExportRequest{Name: "golden-v2", Base: "golden-v2", File: file + "2"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("export against itself: %v, want ErrInvalid", err)
	}
	if _, err := from.Export(ctx, ExportRequest{Name: "golden-v2", Base: "nope", File: file + "2"}); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "nope") {
		t.Errorf("export against an unknown base: %v, want ErrNotFound naming it", err)
	}

	bare := otherHost(t)
	_, err = bare.Import(ctx, ImportRequest{File: file})
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), `"golden-old"`) {
		t.Errorf("import without the base: %v, want ErrNotFound naming golden-old", err)
	}
	if got, _ := filepath.Glob(filepath.Join(bare.Store.StateDir, dirChunks, "*", "*")); len(got) != 0 {
		t.Errorf("import without the base stored chunks %v", got)
	}
	noneLeft(t, bare, "golden-v2", "import without the base")

	impostor := otherHost(t)
	keptFakeAs(t, impostor, "golden-old", func(ram *os.File) { ram.WriteAt([]byte("other"), 0) })
	_, err = impostor.Import(ctx, ImportRequest{File: file})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "another template of that name") {
		t.Errorf("import onto another golden-old: %v", err)
	}
	noneLeft(t, impostor, "golden-v2", "import onto another base")

	// The frames: the line, the header, then the chunks.
	line := bytes.IndexByte(archive, '\n') + 1
	hlen := int(binary.BigEndian.Uint32(archive[line+1:]))
	first := line + 5 + hlen // the first chunk frame
	digest := hex.EncodeToString(archive[first+5 : first+5+32])
	write := func(b []byte) string {
		p := filepath.Join(dir, "edited.vmd")
		os.WriteFile(p, b, 0o600)
		return p
	}
	for _, cut := range []int{line - 3, line + 40, first + 100, len(archive) - 3} {
		_, err := to.Import(ctx, ImportRequest{File: write(archive[:cut])})
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("import of the archive cut at %d of %d: %v, want refused", cut, len(archive), err)
		}
		noneLeft(t, to, "golden-v2", "a truncated archive")
	}
	flip := func(at int) []byte {
		b := bytes.Clone(archive)
		b[at] ^= 0x20
		return b
	}
	if _, err := to.Import(ctx, ImportRequest{File: write(flip(first + 5 + 32 + 40))}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "chunk "+digest) {
		t.Errorf("import with a byte flipped in chunk %s: %v, want refused naming it", digest, err)
	}
	noneLeft(t, to, "golden-v2", "a flipped chunk byte")
	if _, err := to.Import(ctx, ImportRequest{File: write(flip(line + 5 + hlen/2))}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "corrupted") {
		t.Errorf("import with a byte flipped in the header: %v", err)
	}
	noneLeft(t, to, "golden-v2", "a flipped header byte")

	got, err := to.Import(ctx, ImportRequest{File: file})
	if err != nil {
		t.Fatal(err)
	}
	if got.Base != "golden-old" || got.Name != "golden-v2" {
		t.Errorf("import result %+v", got)
	}
	rec, err := to.Store.FindKept("golden-v2")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(v2.Paths.RAM)
	have, _ := os.ReadFile(rec.Paths.RAM)
	if !bytes.Equal(want, have) {
		t.Error("the imported RAM differs from the exported template's")
	}
	// Imported, it is a base like a pushed one: its chunk map is the same.
	if m := loadChunkMap(rec.Paths.Dir); m == nil || chunkMapDigest(m) != chunkMapDigest(loadChunkMap(v2.Paths.Dir)) {
		t.Error("the imported template's chunk map differs from the exporter's")
	}
}
