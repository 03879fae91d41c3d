package main

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/vmfork/vmfork"
)

var bootCommand = &cli.Command{
	Name:      "boot",
	Usage:     "create a machine and boot it; returns once its guest agent answers",
	ArgsUsage: "NAME",
	Description: `Boots a new machine from a kernel (with --initrd and --append) or a disk
image, or both. A --disk image is never written: the machine writes to a
qcow2 overlay on it in its own directory. Guest RAM is a file in the mem dir,
so the machine can be forked later. The guest must run qemu-guest-agent on
the virtio-serial port org.qemu.guest_agent.0.

   vmfork boot web --kernel /srv/vmlinuz --initrd /srv/initrd.gz --memory 512M
   vmfork boot db --disk /srv/debian.qcow2 --cpus 2 --port 2222:22
   vmfork boot lab --disk /srv/debian.qcow2 --network bridge=br0
   vmfork boot desk --disk id=os,file=/srv/debian.qcow2 \
       --disk id=home,file=/srv/home.qcow2,fork=keep \
       --disk id=scratch,file=/srv/scratch.qcow2,fork=fresh

--disk may be given several times: the first is the boot disk, the others
extra virtio disks with an id and a fork policy (see vmfork fork --help):
cow (the default), shared (read-only here and in every child), fresh or
keep (children get an empty disk of the same size). They are vdb, vdc, ...
in the order given; the libvirt driver (--connect) also gives each its id as
its serial, so the guest finds it as /dev/disk/by-id/virtio-ID.

An extra disk may be a block device (an LVM volume, a partition, a loop
device: --disk id=data,file=/dev/vg0/data). That one is written in place
until the machine's first fork, which freezes it: from then on the machine's
writes go to an overlay in the state dir, not to the device, until
"vmfork disk commit" (see vmfork disk --help). The boot disk is a file.
Network disks (rbd:, iscsi:, nbd:, URLs) are refused.

--network user (the default) is QEMU's user-mode network, one private NAT
network per machine, where --port works. bridge=BR puts the NIC on host
bridge BR through a tap that vmfork makes and that goes with the machine;
fork children get taps of their own on the same bridge and their own MAC
and DHCP lease. network=NAME is a libvirt network (libvirt driver only);
none is a NIC with nothing behind it.

--device adds a QEMU device, as -device takes it, with an id: a device that
may forbid forking the machine (a passed-through GPU, vfio-pci), which fork
--detach-devices unplugs for the fork and plugs back after. Put it on the
spare hot-plug port, bus=rp2, so that it can be unplugged. --object adds a
backend such a device needs, as -object takes it; children get the objects
but only the devices still plugged in.

   vmfork boot gpu --disk /srv/debian.qcow2 \
       --device vfio-pci,host=0000:65:00.0,id=gpu0,bus=rp2`,
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "kernel", Usage: "kernel image to boot directly"},
		&cli.StringFlag{Name: "initrd", Usage: "initial ramdisk for --kernel"},
		&cli.StringFlag{Name: "append", Usage: "kernel command line for --kernel", Value: "console=ttyS0 quiet panic=-1"},
		&cli.GenericFlag{Name: "disk", Value: &wholeValues{}, Usage: "base disk image (qcow2 or raw), never written (an extra disk's block device: until its first fork): `PATH`, or id=ID,file=PATH[,fork=cow|shared|fresh|keep]; the first is the boot disk; repeatable"},
		&cli.StringFlag{Name: "memory", Aliases: []string{"m"}, Usage: "guest RAM, e.g. 512M or 2G", Value: "512M"},
		&cli.IntFlag{Name: "cpus", Usage: "virtual CPUs", Value: 1},
		&cli.StringSliceFlag{Name: "port", Aliases: []string{"p"}, Usage: "forward loopback HOST port to GUEST port (HOST:GUEST, or GUEST for any free host port); repeatable"},
		&cli.StringFlag{Name: "network", Usage: "what the NIC is plugged into: user, bridge=BRIDGE, network=NAME (libvirt) or none", Value: "user"},
		&cli.GenericFlag{Name: "device", Value: &wholeValues{}, Usage: "extra QEMU device `DRIVER,id=ID[,PROP=VALUE...]` (-device syntax; embedded driver); repeatable"},
		&cli.GenericFlag{Name: "object", Value: &wholeValues{}, Usage: "extra QEMU backend `TYPE,id=ID[,PROP=VALUE...]` a --device needs (-object syntax); repeatable"},
		ttlFlag,
		contractFlag,
		dryRunFlag,
		jsonFlag,
	},
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() != 1 {
			return usageError{fmt.Errorf("boot takes exactly one machine name, got %d arguments", cliCtx.NArg())}
		}
		if err := checkTTLFlag(cliCtx); err != nil {
			return err
		}
		spec, err := bootSpec(cliCtx)
		if err != nil {
			return err
		}
		c, err := contractOf(cliCtx, nil)
		if err != nil {
			return err
		}
		req := vmfork.BootRequest{Name: cliCtx.Args().First(), Spec: spec, Contract: c}
		return run(cliCtx, func(v verb) error {
			return v.planOr(func() (*vmfork.Plan, error) { return v.mg.PlanBoot(v.ctx, req) }, func() error {
				m, err := v.mg.Boot(v.ctx, req)
				if err != nil {
					return err
				}
				if m.Expires, err = applyTTL(v.ctx, cliCtx, v.mg, m.Name); err != nil {
					return err
				}
				return v.print(viewOf(m), func() { fmt.Printf("%s running (pid %d)\n", m.Name, m.PID) })
			})
		})
	},
}

func bootSpec(cliCtx *cli.Context) (vmfork.Spec, error) {
	mem, err := vmfork.ParseMemory(cliCtx.String("memory"))
	if err != nil {
		return vmfork.Spec{}, fmt.Errorf("--memory: %w", err)
	}
	spec := vmfork.Spec{
		Kernel:    absPath(cliCtx.String("kernel")),
		Initrd:    absPath(cliCtx.String("initrd")),
		MemoryMiB: mem,
		CPUs:      cliCtx.Int("cpus"),
	}
	if spec.Kernel != "" {
		spec.Append = cliCtx.String("append")
	}
	var disks []vmfork.DiskArg
	for _, v := range wholeValuesOf(cliCtx, "disk") {
		a, err := vmfork.ParseDiskArg(v)
		if err != nil {
			return spec, fmt.Errorf("--disk: %w", err)
		}
		a.File = absPath(a.File)
		disks = append(disks, a)
	}
	if err := spec.SetDisks(disks); err != nil {
		return spec, fmt.Errorf("--disk: %w", err)
	}
	if spec.Network, err = vmfork.ParseNetwork(cliCtx.String("network")); err != nil {
		return spec, fmt.Errorf("--network: %w", err)
	}
	for _, p := range cliCtx.StringSlice("port") {
		pf, err := vmfork.ParsePortForward(p)
		if err != nil {
			return spec, fmt.Errorf("--port: %w", err)
		}
		spec.Ports = append(spec.Ports, pf)
	}
	for _, arg := range wholeValuesOf(cliCtx, "device") {
		dev, err := vmfork.ParseDevice(arg)
		if err != nil {
			return spec, fmt.Errorf("--device: %w", err)
		}
		spec.Devices = append(spec.Devices, dev)
	}
	spec.Objects = wholeValuesOf(cliCtx, "object")
	return spec, nil
}

func absPath(p string) string {
	if p == "" {
		return ""
	}
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

// wholeValues is a repeatable flag whose values keep their commas, as QEMU's
// -device and -object values need (a StringSliceFlag splits them).
type wholeValues []string

func (w *wholeValues) Set(v string) error { *w = append(*w, v); return nil }
func (w *wholeValues) String() string     { return strings.Join(*w, " ") }

func wholeValuesOf(cliCtx *cli.Context, name string) []string {
	if w, ok := cliCtx.Generic(name).(*wholeValues); ok {
		return *w
	}
	return nil
}
