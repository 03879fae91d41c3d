package libvirtdrv

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"libvirt.org/go/libvirtxml"

	"github.com/vmfork/vmfork"
)

// The source's NIC in testdata/source-migratable.xml, and one on a libvirt
// network as libvirt shows it live.
const (
	userNIC    = "<interface type='user'>"
	networkNIC = "<interface type='network'>\n      <source network='lab' portid='5e1c4e36-0f9a-4a41-8d55-0b1c2a3d4e5f' bridge='virbr7'/>"
)

func TestCheck(t *testing.T) {
	cases := []struct {
		name string
		edit func(string) string
		says []string // elements the error must name; none means forkable
	}{
		{"forkable", func(s string) string { return s }, nil},
		{"anonymous RAM", func(s string) string {
			return strings.Replace(s, "<memoryBacking>\n    <source type='file'/>\n    <access mode='shared'/>\n  </memoryBacking>", "", 1)
		}, []string{"<memoryBacking><source type='file'/>"}},
		{"memfd RAM", func(s string) string { return strings.Replace(s, "<source type='file'/>", "<source type='memfd'/>", 1) },
			[]string{"<memoryBacking><source type='memfd'/>"}},
		{"private RAM (a fork child)", func(s string) string { return strings.Replace(s, "mode='shared'", "mode='private'", 1) }, nil},
		{"balloon", func(s string) string {
			return strings.Replace(s, "<memballoon model='none'/>", "<memballoon model='virtio'/>", 1)
		},
			[]string{"<memballoon model='virtio'>"}},
		{"default balloon", func(s string) string { return strings.Replace(s, "<memballoon model='none'/>", "", 1) },
			[]string{"<memballoon>"}},
		{"discard", func(s string) string {
			return strings.Replace(s, "<access mode='shared'/>", "<access mode='shared'/><discard/>", 1)
		}, []string{"<memoryBacking><discard/>"}},
		{"no vmgenid", func(s string) string { return regexp.MustCompile(`<genid>.*</genid>`).ReplaceAllString(s, "") },
			[]string{"<genid/>"}},
		{"no guest agent", func(s string) string {
			return strings.Replace(s, "name='org.qemu.guest_agent.0'", "name='org.example.other'", 1)
		}, []string{"<channel><target type='virtio' name='org.qemu.guest_agent.0'/>"}},
		{"block disk", func(s string) string {
			s = strings.Replace(s, "<disk type='file' device='disk'>", "<disk type='block' device='disk'>", 1)
			return strings.Replace(s, "<source file='/var/lib/vmfork/machines/web/disk.qcow2'/>", "<source dev='/dev/sdb'/>", 1)
		}, []string{"<disk type='block'> vda"}},
		// Several writable file disks fork together (issue 28).
		{"second writable disk, a read-only one", func(s string) string {
			return strings.Replace(s, "<controller type='usb'", "<disk type='file' device='disk'><source file='/srv/b.qcow2'/><target dev='vdb' bus='virtio'/></disk>"+
				"<disk type='file' device='disk'><source file='/srv/c.qcow2'/><target dev='vdc' bus='virtio'/><readonly/></disk><controller type='usb'", 1)
		}, nil},
		{"second writable disk on a block device", func(s string) string {
			return strings.Replace(s, "<controller type='usb'", "<disk type='block' device='disk'><source dev='/dev/sdb'/><target dev='vdb' bus='virtio'/></disk><controller type='usb'", 1)
		}, []string{"<disk type='block'> vdb"}},
		{"hostdev and no file RAM", func(s string) string {
			s = strings.Replace(s, "<source type='file'/>", "", 1)
			return strings.Replace(s, "<memballoon", "<hostdev mode='subsystem' type='pci'><source><address domain='0' bus='5' slot='0' function='0'/></source></hostdev><memballoon", 1)
		}, []string{"<memoryBacking><source type='file'/>", "<hostdev type='pci'> 0000:05:00.0"}},
		{"libvirt network", func(s string) string { return strings.Replace(s, userNIC, networkNIC, 1) }, nil},
		{"bridge", func(s string) string {
			return strings.Replace(s, userNIC, "<interface type='bridge'>\n      <source bridge='br0'/>", 1)
		}, nil},
		{"second NIC on a shared network, third on user", func(s string) string {
			return strings.Replace(s, "<serial type='pty'>", networkNIC+"<model type='virtio'/></interface><interface type='user'><model type='virtio'/></interface><serial type='pty'>", 1)
		}, []string{"<interface type='network'> (NIC 2)"}},
		{"SR-IOV NIC", func(s string) string {
			return strings.Replace(s, userNIC, "<interface type='hostdev'>\n      <source><address type='pci' domain='0' bus='5' slot='0' function='1'/></source>", 1)
		}, []string{"<interface type='hostdev'>"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := &libvirtxml.Domain{}
			if err := d.Unmarshal(c.edit(sourceXML(t))); err != nil {
				t.Fatal(err)
			}
			err := Check(d)
			if len(c.says) == 0 {
				if err != nil {
					t.Fatalf("Check = %v, want forkable", err)
				}
				return
			}
			var ue *UnforkableError
			if !errors.As(err, &ue) || !errors.Is(err, vmfork.ErrUnsupported) {
				t.Fatalf("Check = %v, want an *UnforkableError wrapping ErrUnsupported", err)
			}
			for _, el := range c.says {
				if !strings.Contains(err.Error(), el) {
					t.Errorf("error %q does not name %s", err, el)
				}
			}
			if len(ue.Problems) != len(c.says) {
				t.Errorf("problems = %+v, want %d", ue.Problems, len(c.says))
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error is not one line: %q", err)
			}
		})
	}
}
