// Package templates holds machine profiles: what a machine gets on this host
// when its spec leaves it open (the accelerator, the CPU model, a MAC, free
// host ports), for both drivers whoever starts its QEMU (the embedded driver
// or libvirt), and whether a QEMU process started from one is still alive.
//
// It is a leaf: it takes plain values (paths, pids, port numbers), never a
// vmfork.Machine, and its errors carry no vmfork sentinel; the drivers add
// those.
package templates
