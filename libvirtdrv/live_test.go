//go:build cgo

package libvirtdrv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmfork/vmfork"
)

// TestTemplateSourceXML: the record's copy first (a template pushed to
// another host has no file), else the file; neither is an error naming the
// template.
func TestTemplateSourceXML(t *testing.T) {
	dir := t.TempDir()
	tpl := &vmfork.Template{ID: "src.1", Paths: vmfork.TemplatePaths{Dir: dir}}
	if _, err := templateSourceXML(tpl); err == nil || !strings.Contains(err.Error(), `template "src.1"`) {
		t.Errorf("no XML anywhere: err = %v, want one naming the template", err)
	}
	if err := os.WriteFile(filepath.Join(dir, FileSourceXML), []byte("<file/>"), 0o600); err != nil {
		t.Fatal(err)
	}
	if x, err := templateSourceXML(tpl); err != nil || x != "<file/>" {
		t.Errorf("file only: %q, %v", x, err)
	}
	tpl.DriverFiles = map[string]string{FileSourceXML: "<record/>"}
	if x, err := templateSourceXML(tpl); err != nil || x != "<record/>" {
		t.Errorf("record and file: %q, %v; want the record's", x, err)
	}
}
