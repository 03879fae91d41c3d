package qemudrv

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/qmp"
)

var _ vmfork.ActiveLayerReporter = (*Driver)(nil)

// ActiveLayers implements vmfork.ActiveLayerReporter: query-block's
// inserted image of each disk device is the node the guest writes. A
// freeze's prepared top (prepareDisks) is open in QEMU before the switch,
// but it is not any device's inserted node until blockdev-snapshot ran.
func (d *Driver) ActiveLayers(ctx context.Context, m *vmfork.Machine) (vmfork.ActiveLayers, error) {
	out := vmfork.ActiveLayers{Disks: map[string]string{}}
	mon, err := qmp.Dial(ctx, m.Paths.QMP, qmp.WithLogger(d.log.WithField("machine", m.Name)))
	if err != nil {
		return out, fmt.Errorf("machine %q: connect to QMP: %w", m.Name, err)
	}
	defer mon.Close()
	var blocks []struct {
		QDev     string `json:"qdev"`
		Inserted *struct {
			File string `json:"file"`
		} `json:"inserted"`
	}
	if err := mon.Execute(ctx, "query-block", nil, &blocks); err != nil {
		return out, fmt.Errorf("machine %q: query disks: %w", m.Name, err)
	}
	for _, b := range blocks {
		if b.Inserted == nil {
			continue
		}
		if strings.Contains(b.QDev, "/disk0/") {
			out.Disk = imageFile(b.Inserted.File)
		}
		for _, ds := range m.Spec.Disks {
			if strings.Contains(b.QDev, "/"+extraDevice(ds.ID)+"/") {
				out.Disks[ds.ID] = imageFile(b.Inserted.File)
			}
		}
	}
	return out, nil
}

// imageFile returns the file of a node's filename as QEMU reports it: a
// plain path, or, when the node's options differ from what its image
// header says (a top whose backing blockdev-snapshot set to a node of
// another name than the header's), a "json:{...}" filename whose file
// child names the path.
func imageFile(name string) string {
	js, ok := strings.CutPrefix(name, "json:")
	if !ok {
		return name
	}
	var opts struct {
		File json.RawMessage `json:"file"`
	}
	if json.Unmarshal([]byte(js), &opts) != nil || len(opts.File) == 0 {
		return ""
	}
	var file struct {
		Filename string `json:"filename"`
	}
	if json.Unmarshal(opts.File, &file) == nil && file.Filename != "" {
		return file.Filename
	}
	var s string // "file": "/path", the short form
	if json.Unmarshal(opts.File, &s) == nil {
		return s
	}
	return ""
}
