// Package profile holds what a machine gets on this host where its spec
// leaves it open, and what both drivers must render alike: the accelerator
// and CPU model (profile.go), a MAC, free host ports, and the guest-visible
// layout (layout.go: the RAM block's id, the agent's port name), whoever
// starts its QEMU (the embedded driver's argv, libvirt's domain XML).
//
// It is a leaf: it takes plain values (port numbers, a logger), never a
// vmfork.Machine, and its errors carry no vmfork sentinel; the drivers add
// those.
package profile
