// Package qemudrv is vmfork's embedded default driver: it runs
// qemu-system-x86_64 itself, with no daemon in between.
//
// Each machine is one QEMU process started in its own process group, with its
// output sent to qemu.log in the machine's directory, so it outlives the CLI
// that started it. Later commands find it by PID (checked against
// /proc/PID/cmdline, so a reused PID is never mistaken for it) and talk to it
// over its QMP and guest-agent unix sockets.
//
// Guest RAM is a memory-backend-file on tmpfs. A booted machine maps its own
// file share=on, which is what lets a fork freeze the RAM without streaming it
// through QEMU; a fork child maps its template's frozen file share=off.
// The QEMU command line is built by Argv from the machine's record alone, so a
// child built from its parent's Spec has the identical device configuration
// that loading the parent's device state requires.
package qemudrv
