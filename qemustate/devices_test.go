package qemustate

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

// hmpExecutor answers human-monitor-command with out (or fails it with
// err), add-fd with fd set 7, and anything else with nothing.
type hmpExecutor struct {
	out string
	err error
}

func (h hmpExecutor) Execute(_ context.Context, cmd string, _, result any) error {
	if cmd != "human-monitor-command" {
		return nil
	}
	if h.err != nil {
		return h.err
	}
	b, _ := json.Marshal(h.out)
	return json.Unmarshal(b, result)
}

func (h hmpExecutor) ExecuteWithFile(_ context.Context, cmd string, _ any, _ *os.File, result any) error {
	if cmd == "add-fd" {
		return json.Unmarshal([]byte(`{"fdset-id": 7, "fd": 30}`), result)
	}
	return nil
}

// QEMU 7.2's "info ramblock" of the test guest (q35, virtio-net with its
// option ROM), as read from a running machine.
const ramblocks = `              Block Name    PSize              Offset               Used              Total
                  pc.ram    4 KiB  0x0000000000000000 0x0000000020000000 0x0000000020000000
    /rom@etc/acpi/tables    4 KiB  0x00000000200c0000 0x0000000000020000 0x0000000000200000
                 pc.bios    4 KiB  0x0000000020000000 0x0000000000040000 0x0000000000040000
0000:00:03.0:00.0/virtio-net-pci.rom    4 KiB  0x0000000020080000 0x0000000000040000 0x0000000000040000
                  pc.rom    4 KiB  0x0000000020040000 0x0000000000020000 0x0000000000020000
   /rom@etc/table-loader    4 KiB  0x00000000202c0000 0x0000000000001000 0x0000000000010000
      /rom@etc/acpi/rsdp    4 KiB  0x0000000020300000 0x0000000000001000 0x0000000000001000
`

func TestNonRAMBlocks(t *testing.T) {
	for _, tc := range []struct {
		name, out, shared string
		want              []string
		wantErr           bool
	}{
		{name: "ROMs only", out: ramblocks, shared: "pc.ram"},
		{name: "another RAM backend", out: ramblocks, shared: "other", want: []string{"pc.ram"}},
		{name: "video RAM", out: ramblocks + "                vga.vram    4 KiB  0x0000000020400000 0x0000000001000000 0x0000000001000000\n",
			shared: "pc.ram", want: []string{"vga.vram"}},
		{name: "a block whose owner is gone", out: ramblocks + "                            4 KiB  0x0000000020400000 0x0000000000100000 0x0000000000100000\n",
			shared: "pc.ram", want: []string{"(unnamed)"}},
		{name: "not a listing", out: "unknown command: 'info'", shared: "pc.ram", wantErr: true},
		{name: "empty", out: "", shared: "pc.ram", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := NonRAMBlocks(t.Context(), hmpExecutor{out: tc.out}, tc.shared)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("blocks = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestPrepareDeviceState checks which save a freeze gets: the device
// sections alone only when the guest's memory is in its own file and QEMU has
// no other writable RAM block; the migration stream otherwise, also when QEMU
// cannot tell.
func TestPrepareDeviceState(t *testing.T) {
	vga := ramblocks + "                vga.vram    4 KiB  0x0000000020400000 0x0000000001000000 0x0000000001000000\n"
	for _, tc := range []struct {
		name      string
		ex        hmpExecutor
		ramInFile bool
		want      bool
	}{
		{"ROMs only", hmpExecutor{out: ramblocks}, true, true},
		{"share=off: RAM only in the stream", hmpExecutor{out: ramblocks}, false, false},
		{"video RAM", hmpExecutor{out: vga}, true, false},
		{"QEMU cannot tell", hmpExecutor{err: errors.New("no HMP")}, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "devstate")
			s, err := PrepareDeviceState(t.Context(), tc.ex, path, "vmfork-devstate", "pc.ram", tc.ramInFile, time.Millisecond, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Release()
			if s.DevicesOnly != tc.want || s.Save == nil {
				t.Errorf("DevicesOnly = %v (save %v), want %v", s.DevicesOnly, s.Save != nil, tc.want)
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("device-state file not made: %v", err)
			}
		})
	}
}

func TestBlockOf(t *testing.T) {
	blocks := []string{"vga.vram", "/objects/shm0", "/machine/peripheral/ivshmem0/shm1"}
	for id, want := range map[string]string{"shm0": "/objects/shm0", "shm1": "/machine/peripheral/ivshmem0/shm1", "vram": "", "vga.vram": "vga.vram", "hm0": ""} {
		if got := BlockOf(blocks, id); got != want {
			t.Errorf("BlockOf(%q) = %q, want %q", id, got, want)
		}
	}
}
