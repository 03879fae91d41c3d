// Package qemustate runs QEMU's state sequences over a qmp.Executor: the device-state save of a
// freeze, its load into a fork child, and the migration waits between them. Package qmp speaks
// the protocol; this package knows the order of the commands and what each state means. Both
// drivers share it: qemudrv runs it on its own *qmp.Monitor, libvirtdrv through libvirt's
// monitor passthrough (an Executor built on qmp.EncodeCommand and qmp.DecodeReply). It imports
// qmp and nothing else of the project.
//
// # What a device-state save is
//
// A fork child is a second QEMU that takes over a paused source's memory, disks and devices. The
// memory is a file (package sharedmem freezes it) and the disks are qcow2 overlays; what is left
// is the device state: vCPU registers, interrupt controllers, timers, virtio queues, a few
// hundred KB. A freeze saves it into a file while the source is paused (the template's devstate),
// and each child's QEMU, started with -incoming defer, loads it (LoadDeviceState, after
// SetIgnoreShared) before it may run. A child is never resumed before its load has completed:
// QEMU 7.2 activates the images before it checks the state, and an early cont fails with a
// write-lock error and can kill the incoming QEMU.
//
// # Device sections or a migration stream
//
// QEMU writes that state in one of two forms, and PrepareDeviceState chooses before the pause:
//
//   - The device sections alone (SaveDevices): xen-save-devices-state with live=false writes
//     them from the QMP call itself, with no RAM block and no migration thread, and leaves the
//     block nodes active, so the cont after it is cheap. It is right only when the guest's memory
//     file holds all of its writable memory; NonRAMBlocks lists any other RAM block (video RAM,
//     a device's memory), whose contents only a migration stream carries. The file has no
//     configuration section and records the run state as running, so the QEMU that loads it is
//     started with DevicesOnlyArgs.
//   - A migration stream (SaveDeviceState): migrate with x-ignore-shared, which leaves out the
//     shared memory file but carries every other RAM block. It suits any guest and costs more of
//     the pause: QEMU's migration thread, polls for its end, and block nodes inactivated at the
//     end that cont has to activate again (devices.go has the figures).
//
// Both are loaded the same way, with migrate-incoming. Before anything is paused, PrepareSave
// checks that QEMU will save the VM at all (ErrMigrationBlocked, with QEMU's reasons, such as a
// device without migration support) and sets x-ignore-shared, which both ends need.
//
// # Why fd: and fd sets
//
// QEMU opens no path and runs no shell. vmfork creates the file (O_EXCL, before the pause, so
// file creation stays out of it: CreateSaveFile, CreateDevicesFile) and hands QEMU a descriptor.
// The migration stream goes to getfd (qmp.GetFD) and an "fd:name" URI: exec: would run
// /bin/sh -c, for which libvirt's seccomp sandbox kills QEMU, and QEMU 7.2 has no file: URI.
// xen-save-devices-state takes a file name, so its descriptor goes into an fd set (add-fd) and
// the name is /dev/fdset/N. Each Create returns a release that lets QEMU's copy go; call it once
// the save is over or did not happen.
//
// # Every terminal migration state
//
// WaitMigration polls query-migrate until "completed", "failed" or "cancelled". The last two end
// the wait at once with an error wrapping ErrMigrationFailed and QEMU's error-desc, instead of
// spinning until a deadline. On a *qmp.Monitor the wait also ends as soon as the connection does,
// with an error wrapping qmp.ErrClosed: a failed incoming load makes QEMU exit. "none" is not
// terminal, because an incoming QEMU reports it until the stream starts. A save whose ctx ends
// first is cancelled with migrate_cancel: QMP cancels nothing by itself, and a save that
// completed after the caller resumed the VM would stop it again (QEMU's "postmigrate").
//
// # Logging
//
// A function that logs takes a *logrus.Entry, nil meaning none, and logs at debug level only. It
// never uses logrus's global logger, so the caller chooses fields and sinks.
package qemustate
