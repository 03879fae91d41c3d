// Package templates holds what both drivers must render alike: machine
// profiles (what a machine gets on this host when its spec leaves it open:
// the accelerator, the CPU model, a MAC, free host ports) and the
// guest-visible layout (layout.go: the RAM block's id, the agent's port
// name), whoever starts its QEMU (the embedded driver's argv, libvirt's
// domain XML); and whether a QEMU process started from one is still alive.
//
// It is a leaf: it takes plain values (paths, pids, port numbers), never a
// vmfork.Machine, and its errors carry no vmfork sentinel; the drivers add
// those.
package templates
