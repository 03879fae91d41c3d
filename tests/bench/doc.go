// Package bench is vmfork's side-by-side benchmark harness, behind
// `vmfork bench peers|burst|scale|stall`. It boots the project's test guest and
// measures vmfork against what a user has without it, on the same host in
// the same run, so that every figure comes with its reference:
//
//   - vmfork fork: Manager.Fork in-process with the embedded QEMU driver;
//     time to running and to ready are ForkResult's.
//   - the floor: a bare qemu-system-x86_64 -incoming defer with the same
//     argv, loading the same template (nothing of vmfork around it).
//   - a kept template: the source's instant kept once (vmfork template
//     save) with a warm pool of one prestarted QEMU; each round forks one
//     child from it (Manager.Fork), which takes the pool's process (kept.go).
//   - libvirt save/restore: a plain transient libvirt domain of the same
//     guest, `virsh save`, then `virsh restore` of a copy of the save file.
//   - cold boot: the same guest booted from scratch.
//   - the libvirt driver: Manager.Fork of a source booted through vmfork's
//     libvirt driver (its own state dir), next to libvirt's own start of the
//     same child XML, `virsh create --paused` (lvfork.go).
//
// With a guest use (--guest-use), every source guest first fills that much
// of its RAM with non-zero data (guestuse.go), so that the clones copy what
// a guest in use holds; a cold boot cannot carry it.
//
// Every child is read (PSS from /proc/PID/smaps_rollup) at the same age
// after it answered. An Env owns everything a run starts: its own vmfork
// state and mem dirs, the QEMU processes it spawns, its libvirt domains.
// Env.Close removes all of it, also after an error or a Ctrl-C.
//
// The harness needs root (or a user allowed to run QEMU and libvirt), a
// built test guest, and libvirtd for the libvirt comparator. Its unit tests
// boot nothing.
package bench
