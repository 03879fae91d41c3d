//go:build cgo

package libvirtdrv

import (
	"context"
	"encoding/json"
	"os"
	"testing"

	"libvirt.org/go/libvirtxml"
)

// hmpRAMBlocks answers human-monitor-command "info ramblock" with out.
type hmpRAMBlocks struct{ out string }

func (h hmpRAMBlocks) Execute(_ context.Context, cmd string, _, result any) error {
	b, _ := json.Marshal(h.out)
	return json.Unmarshal(b, result)
}

func (h hmpRAMBlocks) ExecuteWithFile(ctx context.Context, cmd string, args any, _ *os.File, result any) error {
	return h.Execute(ctx, cmd, args, result)
}

const ramblockHeader = "              Block Name    PSize              Offset               Used              Total\n"

// TestRAMBlockGone: an unplugged <shmem> counts as gone only once QEMU has
// freed its backend's RAM block, which QEMU names after the device's path.
func TestRAMBlockGone(t *testing.T) {
	lingering := ramblockHeader +
		"                  pc.ram    4 KiB  0x0000000000000000 0x0000000010000000 0x0000000010000000\n" +
		"0000:00:01.0:00.0:01.0/shmmem-shmem0    4 KiB  0x0000000010340000 0x0000000000100000 0x0000000000100000\n" +
		"                 pc.bios    4 KiB  0x0000000010000000 0x0000000000040000 0x0000000000040000\n"
	freed := ramblockHeader +
		"                  pc.ram    4 KiB  0x0000000000000000 0x0000000010000000 0x0000000010000000\n" +
		"                 pc.bios    4 KiB  0x0000000010000000 0x0000000000040000 0x0000000000040000\n"
	ctx := context.Background()
	for _, tc := range []struct {
		out, name string
		want      bool
	}{
		{lingering, "shmmem-shmem0", false},
		{freed, "shmmem-shmem0", true},
		// Another device's block, whose alias ends the same way.
		{lingering, "shmmem-em0", true},
		// A device with no RAM block (a <hostdev>) waits for nothing.
		{lingering, "", true},
	} {
		got, err := ramBlockGone(ctx, hmpRAMBlocks{tc.out}, tc.name)
		if err != nil || got != tc.want {
			t.Errorf("ramBlockGone(%q) = %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
	if _, err := ramBlockGone(ctx, hmpRAMBlocks{"garbage"}, "shmmem-shmem0"); err == nil {
		t.Error("ramBlockGone on unreadable output: no error")
	}
}

func TestUnpluggablesRAMBlock(t *testing.T) {
	live := &libvirtxml.Domain{Devices: &libvirtxml.DomainDeviceList{
		Shmems:   []libvirtxml.DomainShmem{{Name: "web-shm", Alias: &libvirtxml.DomainAlias{Name: "shmem0"}}},
		Hostdevs: []libvirtxml.DomainHostdev{{Alias: &libvirtxml.DomainAlias{Name: "hostdev0"}}},
	}}
	us, err := unpluggables(live)
	if err != nil || len(us) != 2 {
		t.Fatalf("unpluggables = %v, %v", us, err)
	}
	if us[0].ramBlock != "shmmem-shmem0" || us[1].ramBlock != "" {
		t.Errorf("RAM blocks %q and %q, want libvirt's shmmem-shmem0 and none", us[0].ramBlock, us[1].ramBlock)
	}
}
