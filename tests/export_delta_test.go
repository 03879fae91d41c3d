//go:build integration

package tests

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type deltaExportJSON struct {
	Archive      int64  `json:"archive_bytes"`
	Stored       int64  `json:"stored_bytes"`
	Base         string `json:"base"`
	Chunks       int    `json:"chunks"`
	ChunksStored int    `json:"chunks_stored"`
}

// TestExportDeltaOffline is the offline move of a new golden image: host b
// got template base yesterday as a full archive; today only a delta
// archive of v2 against base travels (export --base), b rebuilds v2 over
// its base and a child of v2 there sees v2's instant, not base's. Two
// "hosts" are two state and mem dirs on this machine: the archives are
// files, no link is involved.
func TestExportDeltaOffline(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	a, b := newEnv(t), newEnv(t)
	dir := t.TempDir()
	a.boot("src")
	a.exec("src", "sh", "-c", "echo base > /run/instant; sync")
	a.ok("template", "save", "src", "base")
	full := filepath.Join(dir, "base.vmt")
	var fx deltaExportJSON
	a.jsonOK(&fx, "template", "export", "base", full)
	b.ok("template", "import", full)

	// The new instant: 4 MiB of new data in the guest's RAM.
	a.exec("src", "sh", "-c", "echo v2 > /run/instant; dd if=/dev/urandom of=/run/delta bs=1M count=4 2>/dev/null; sync")
	a.ok("template", "save", "src", "v2")
	a.ok("rm", "src", "--force")
	delta := filepath.Join(dir, "v2.vmd")
	var dx deltaExportJSON
	a.jsonOK(&dx, "template", "export", "v2", "--base", "base", delta)
	t.Logf("full archive of base: %.1f MiB; delta archive of v2 against it: %.1f MiB (%d of %d chunks, %.1f MiB of them)",
		mib(fx.Archive), mib(dx.Archive), dx.ChunksStored, dx.Chunks, mib(dx.Stored))
	if st, err := os.Stat(delta); err != nil || st.Size() != dx.Archive || dx.Base != "base" {
		t.Fatalf("delta archive %s: %v, export said %+v", delta, err, dx)
	}
	// 4 MiB of random pages and what the guest changed besides: well
	// under the full archive, and not every chunk.
	if dx.ChunksStored == 0 || dx.ChunksStored >= dx.Chunks || dx.Archive < 4<<20 || dx.Archive > fx.Archive/3 {
		t.Errorf("delta export %+v against a full archive of %d bytes: want 4 MiB and more, under a third", dx, fx.Archive)
	}

	// A host whose "base" is another template (v2's instant, kept under
	// that name) refuses the delta, naming base, before writing anything.
	other := filepath.Join(dir, "v2.vmt")
	a.ok("template", "export", "v2", other)
	c := newEnv(t)
	c.ok("template", "import", other, "--as", "base")
	r := c.vmfork("template", "import", delta)
	if line := errorLine(r.stderr); r.code != 2 || !strings.Contains(line, `"base"`) || !strings.Contains(line, "another template of that name") {
		t.Errorf("import of the delta onto another base: %s, want exit 2 naming base", r)
	}
	if r := c.vmfork("template", "ls", "--json"); strings.Contains(r.stdout, `"v2"`) {
		t.Errorf("the refused import left template v2: %s", r.stdout)
	}

	var im struct {
		Name string `json:"name"`
		Base string `json:"base"`
	}
	b.jsonOK(&im, "template", "import", delta)
	if im.Name != "v2" || im.Base != "base" {
		t.Fatalf("import of the delta = %+v", im)
	}
	b.ok("fork", "v2", "kid")
	if got := b.exec("kid", "cat", "/run/instant"); got != "v2\n" {
		t.Errorf("kid of the imported v2: /run/instant = %q, want v2's instant", got)
	}
	b.ok("rm", "kid", "--force")
}
