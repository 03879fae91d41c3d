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
// Overlays are written in Go, as qemu-img 7.2 would make them (a process
// cost a child several milliseconds of its start), always naming the backing
// format, which QEMU 7.2 requires; Rebase still runs qemu-img. Chains are
// read with go-qcow2reader, without QEMU.
package overlay
