package vmfork

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A libvirt template's children are made from the domain XML in its
// directory (FileDomainXML): an archive carries it, and the import points
// its kernel and initrd, and the manifest's line that names them, at the
// imported files, as the record's; a push does the same. Without it an imported libvirt
// template's fork failed on the missing file.
func TestExportImportDomainXML(t *testing.T) {
	mg, _ := newTestManager(t)
	tpl := keptFake(t, mg)
	initrd := filepath.Join(t.TempDir(), "initrd & co")
	if err := os.WriteFile(initrd, []byte("initrd image"), 0o600); err != nil {
		t.Fatal(err)
	}
	k := tpl.Spec.Kernel
	tpl.Spec.Initrd = initrd
	tpl.Manifest.Devices = []string{`kernel ` + k + ` initrd ` + initrd + ` cmdline "console=ttyS0"`, "virtio-rng pci 0000:00:01.0"}
	if err := mg.Store.WriteTemplate(tpl); err != nil {
		t.Fatal(err)
	}
	xml := "<domain>\n  <os>\n    <kernel>" + k + "</kernel>\n    <initrd>" + strings.ReplaceAll(initrd, "&", "&amp;") + "</initrd>\n  </os>\n  <memoryBacking/>\n</domain>\n"
	if err := os.WriteFile(filepath.Join(tpl.Paths.Dir, FileDomainXML), []byte(xml), 0o600); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "golden.vmt")
	if _, err := mg.Export(t.Context(), ExportRequest{Name: "golden", File: file}); err != nil {
		t.Fatal(err)
	}

	other, _ := newTestManager(t)
	if _, err := other.Import(t.Context(), ImportRequest{File: file, As: "copy"}); err != nil {
		t.Fatal(err)
	}
	got, err := other.Store.FindKept("copy")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(got.Paths.Dir, FileDomainXML))
	if err != nil {
		t.Fatalf("imported template has no domain XML: %v", err)
	}
	want := strings.NewReplacer(k, got.Spec.Kernel, strings.ReplaceAll(initrd, "&", "&amp;"), strings.ReplaceAll(got.Spec.Initrd, "&", "&amp;")).Replace(xml)
	if string(b) != want || !strings.HasPrefix(got.Spec.Kernel, got.Paths.Dir) || !strings.HasPrefix(got.Spec.Initrd, got.Paths.Dir) {
		t.Errorf("imported domain XML:\n%s\nwant:\n%s", b, want)
	}
	line := `kernel ` + got.Spec.Kernel + ` initrd ` + got.Spec.Initrd + ` cmdline "console=ttyS0"`
	if got.Manifest.Devices[0] != line || got.Manifest.Devices[1] != tpl.Manifest.Devices[1] {
		t.Errorf("imported manifest devices %q, want %q first", got.Manifest.Devices, line)
	}

	// A push carries it too (the same files, as chunks).
	to := NewManager(newTestStore(t), &hostDriver{&linkDriver{fakeDriver: newFakeDriver()}, "7.2.0"}, nil)
	if _, sendErr, recvErr := transferPair(t, mg, to, "golden", "pushed"); sendErr != nil || recvErr != nil {
		t.Fatalf("push: sender %v, receiver %v", sendErr, recvErr)
	}
	pushed, err := to.Store.FindKept("pushed")
	if err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(pushed.Paths.Dir, FileDomainXML)); err != nil || !strings.Contains(string(b), "<kernel>"+pushed.Spec.Kernel+"</kernel>") {
		t.Errorf("pushed template's domain XML (%v):\n%s\nwant its kernel %s", err, b, pushed.Spec.Kernel)
	}

	// A template without one (the embedded driver's) gets none.
	os.Remove(filepath.Join(tpl.Paths.Dir, FileDomainXML))
	if _, err := mg.Export(t.Context(), ExportRequest{Name: "golden", File: file}); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Import(t.Context(), ImportRequest{File: file, As: "plain"}); err != nil {
		t.Fatal(err)
	}
	plain, err := other.Store.FindKept("plain")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(plain.Paths.Dir, FileDomainXML)); !os.IsNotExist(err) {
		t.Errorf("import of an archive without domain XML made one (%v)", err)
	}
}
