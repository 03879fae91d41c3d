// Package overlay manages the qcow2 layers under vmfork's machines.
//
// Who writes which layer: a machine's QEMU writes only the top layer, its own
// disk.qcow2. Everything below is read-only. A booted machine's first layer
// sits on the user's base image, which vmfork never writes. A fork switches
// the running parent to a new top layer (QEMU's blockdev-snapshot-sync); the
// parent's previous top becomes the template's frozen disk, and every child
// gets a fresh overlay on it. A frozen layer is removed only when no machine's
// chain includes it any more.
//
// Overlays are made with qemu-img, which QEMU 7.2 requires to be told the
// backing format (-F); chains are read with go-qcow2reader, without QEMU.
package overlay
