//go:build integration

package tests

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type transferJSON struct {
	Op       string  `json:"op"`
	Name     string  `json:"name"`
	ID       string  `json:"id"`
	BytesOut int64   `json:"bytes_out"`
	BytesIn  int64   `json:"bytes_in"`
	Codec    string  `json:"codec"`
	Elapsed  float64 `json:"elapsed_ms"`
	CutMS    float64 `json:"cut_ms"`
	Received struct {
		BuildMS    float64 `json:"build_ms"`
		Name       string  `json:"name"`
		ID         string  `json:"id"`
		Base       string  `json:"base"`
		Chunks     int     `json:"chunks"`
		ChunksSent int     `json:"chunks_sent"`
		Stored     int64   `json:"stored_bytes"`
	} `json:"received"`
}

// chunkMap is a template's chunks.json, as far as the test reads it.
type chunkMap struct {
	Files []struct {
		Name   string `json:"name"`
		Chunks []struct {
			Off    int64  `json:"off"`
			Len    int64  `json:"len"`
			Digest string `json:"sha256"`
		} `json:"chunks"`
	} `json:"files"`
}

func (h *rigHost) chunkMap(id string) chunkMap {
	h.t.Helper()
	var m chunkMap
	data, err := os.ReadFile(filepath.Join(h.stateDir, "templates", id, "chunks.json"))
	if err != nil || json.Unmarshal(data, &m) != nil {
		h.t.Fatalf("chunk map of template %s on host %s: %v", id, h.name, err)
	}
	return m
}

// chunk reads chunk d of h's store.
func (h *rigHost) chunk(d string) []byte {
	h.t.Helper()
	b, err := os.ReadFile(filepath.Join(h.stateDir, "chunks", d[:2], d))
	if err != nil {
		h.t.Fatal(err)
	}
	return b
}

// differing counts what of template newID differs from template oldID on
// h: the 4 KiB pages (and the bytes) of every file that are not the same
// at the same offset (a chunk missing from a map reads as zeros).
func (h *rigHost) differing(oldID, newID string) (pages, bytesDiff int64) {
	old, cur := h.chunkMap(oldID), h.chunkMap(newID)
	type key struct {
		file string
		off  int64
	}
	read := func(m chunkMap) map[key][]byte {
		out := map[key][]byte{}
		for _, f := range m.Files {
			for _, c := range f.Chunks {
				out[key{f.Name, c.Off}] = h.chunk(c.Digest)
			}
		}
		return out
	}
	a, b := read(old), read(cur)
	keys := map[key]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	for k := range keys {
		x, y := a[k], b[k]
		n := max(len(x), len(y))
		x, y = append(x, make([]byte, n-len(x))...), append(y, make([]byte, n-len(y))...)
		for p := 0; p < n; p += 4096 {
			e := min(p+4096, n)
			if !bytes.Equal(x[p:e], y[p:e]) {
				pages++
				for i := p; i < e; i++ {
					if x[i] != y[i] {
						bytesDiff++
					}
				}
			}
		}
	}
	return pages * 4096, bytesDiff
}

// TestTemplatePushPull (issue 24): between two simulated hosts (hosts_test.go),
//   - a receiver whose QEMU reports another version refuses the manifest,
//     naming the field, before any chunk is sent;
//   - a pushed template forks on the other host, its child going on from the
//     saved instant (the parent's memory);
//   - a second template of the same source, pushed where the first is,
//     sends no more than the pages that differ plus 5%;
//   - a pull of a template one of whose chunks has a byte flipped in the
//     sender's store is refused naming the chunk, leaving nothing; gc
//     collects the chunks no template names.
func TestTemplatePushPull(t *testing.T) {
	parallel(t) // self-contained (tests/doc.go, "Parallel")
	r := newHostRig(t)
	a, b := r.hosts[0], r.hosts[1]
	a.boot("src")
	a.exec("src", "vmfork-counter", "start")
	a.exec("src", "sh", "-c", "echo saved > /run/at-save; echo on-disk > /data/at-save; sync")
	before := a.counter("src")
	a.ok("template", "save", "src", "base")

	// Another QEMU on B: a wrapper that reports 9.9.9.
	fake := filepath.Join(r.dir, "qemu-9.9.9")
	script := "#!/bin/sh\nif [ \"$1\" = --version ]; then echo 'QEMU emulator version 9.9.9'; exit 0; fi\nexec qemu-system-x86_64 \"$@\"\n"
	if err := os.WriteFile(fake, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	res := a.vmfork(append([]string{"template", "push", "base", b.addr}, r.transfer("VMFORK_QEMU="+fake)...)...)
	if line := errorLine(res.stderr); res.code == 0 || !strings.Contains(line, `QEMU version`) || !strings.Contains(line, `"9.9.9"`) {
		t.Errorf("push to a host with QEMU 9.9.9: %s, want a one-line refusal naming the QEMU version", res)
	}
	if got := b.chunkFiles(); len(got) != 0 {
		t.Errorf("the refused push left %d chunks on the receiver", len(got))
	}
	b.storeIsEmpty("the refused push")

	var p1 transferJSON
	a.jsonOK(&p1, append([]string{"template", "push", "base", b.addr}, r.transfer()...)...)
	if p1.Received.Name != "base" || p1.Received.ChunksSent == 0 || p1.Received.ChunksSent != p1.Received.Chunks {
		t.Fatalf("push of base to an empty host = %+v", p1)
	}
	t.Logf("push of base (fresh): %d chunks, %.1f MiB stored, %.1f MiB out (%s), %.1f KiB in, %.0f ms",
		p1.Received.Chunks, mib(p1.Received.Stored), mib(p1.BytesOut), p1.Codec, float64(p1.BytesIn)/1024, p1.Elapsed)
	// Both sides take zstd; a booted guest's RAM (kernel, page cache)
	// compresses, so less crosses than the chunks hold.
	if p1.Codec != "zstd" || p1.BytesOut >= p1.Received.Stored {
		t.Errorf("fresh push: codec %q, %d bytes out for %d stored, want zstd and fewer", p1.Codec, p1.BytesOut, p1.Received.Stored)
	}
	b.ok("fork", "base", "kid")
	if got := b.exec("kid", "cat", "/run/at-save", "/data/at-save"); got != "saved\non-disk\n" {
		t.Errorf("kid on host b: files of the saved instant = %q", got)
	}
	if n := b.counter("kid"); n < before {
		t.Errorf("kid on host b: counter %d, want it to go on from %d (the save)", n, before)
	}
	b.ok("rm", "kid", "--force")

	// The delta: 8 MiB of new data in the guest's RAM, then a second save.
	a.exec("src", "sh", "-c", "dd if=/dev/urandom of=/run/delta bs=1M count=8 2>/dev/null")
	a.ok("template", "save", "src", "v2")
	var p2 transferJSON
	a.jsonOK(&p2, append([]string{"template", "push", "v2", b.addr}, r.transfer()...)...)
	baseID := templateID(t, a.env, "base")
	v2ID := templateID(t, a.env, "v2")
	diffPages, diffBytes := a.differing(baseID, v2ID)
	t.Logf("push of v2 (delta, base %s there): %d of %d chunks, %.2f MiB out, %.1f KiB in (page hashes), %.0f ms; differing: %.2f MiB in pages, %.2f MiB in bytes",
		p2.Received.Base, p2.Received.ChunksSent, p2.Received.Chunks, mib(p2.BytesOut), float64(p2.BytesIn)/1024, p2.Elapsed, mib(diffPages), mib(diffBytes))
	if diffPages < 8<<20 {
		t.Errorf("v2 differs from base in %d bytes of pages, want at least the 8 MiB written", diffPages)
	}
	if p2.Received.Base == "" || float64(p2.BytesOut) > 1.05*float64(diffPages) {
		t.Errorf("push of v2: %d bytes sent (base %q), want at most the %d bytes of differing pages + 5%%", p2.BytesOut, p2.Received.Base, diffPages)
	}

	// A pull with a flipped byte in the sender's store. A gives v2 up, and
	// gc takes the chunks only v2 named from A's store.
	a.ok("template", "rm", "v2")
	var gc struct {
		Chunks int `json:"chunks_removed"`
	}
	a.jsonOK(&gc, "gc")
	if gc.Chunks == 0 {
		t.Errorf("gc after template rm v2 removed no chunks")
	}
	have := map[string]bool{}
	for _, d := range a.chunkFiles() {
		have[d] = true
	}
	bV2 := templateID(t, b.env, "v2")
	var victim string
	for _, f := range b.chunkMap(bV2).Files {
		for _, c := range f.Chunks {
			if victim == "" && f.Name == "ram" && !have[c.Digest] {
				victim = c.Digest
			}
		}
	}
	if victim == "" {
		t.Fatal("no chunk of v2 that host a lacks")
	}
	path := filepath.Join(b.stateDir, "chunks", victim[:2], victim)
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	bad := bytes.Clone(good)
	bad[len(bad)/3] ^= 0x40
	if err := os.WriteFile(path, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	res = a.vmfork(append([]string{"template", "pull", b.addr + ":v2"}, r.transfer()...)...)
	if res.code == 0 || !strings.Contains(errorLine(res.stderr), "chunk "+victim) {
		t.Errorf("pull with chunk %s corrupted on the sender: %s, want a one-line refusal naming it", victim, res)
	}
	for _, d := range a.chunkFiles() {
		if d == victim {
			t.Errorf("the refused chunk %s is in host a's store", victim)
		}
	}
	if r := a.vmfork("template", "ls", "--json"); strings.Contains(r.stdout, `"v2"`) {
		t.Errorf("the refused pull left template v2 on host a: %s", r.stdout)
	}
	if err := os.WriteFile(path, good, 0o600); err != nil {
		t.Fatal(err)
	}
	var p3 transferJSON
	a.jsonOK(&p3, append([]string{"template", "pull", b.addr + ":v2"}, r.transfer()...)...)
	if p3.Received.Name != "v2" || p3.Received.Base != baseID {
		t.Errorf("pull of v2 back = %+v, want it kept as v2, diffed against %s", p3, baseID)
	}
	t.Logf("pull of v2 (delta): %d of %d chunks, %.2f MiB in, %.0f ms", p3.Received.ChunksSent, p3.Received.Chunks, mib(p3.BytesIn), p3.Elapsed)
}

// errorLine returns the one error line of a vmfork's stderr, less its
// progress lines; "" unless there is exactly one.
func errorLine(stderr string) string {
	var errs []string
	for _, l := range strings.Split(strings.TrimSpace(stderr), "\n") {
		if !strings.HasPrefix(l, "push: ") && !strings.HasPrefix(l, "pull: ") {
			errs = append(errs, l)
		}
	}
	if len(errs) != 1 {
		return ""
	}
	return errs[0]
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// templateID returns the id of the template kept as name in e's store.
func templateID(t testing.TB, e *env, name string) string {
	t.Helper()
	var ts []struct {
		ID   string `json:"id"`
		Name string `json:"name"`
	}
	e.jsonOK(&ts, "template", "ls")
	for _, x := range ts {
		if x.Name == name {
			return x.ID
		}
	}
	t.Fatalf("no template kept as %s", name)
	return ""
}
