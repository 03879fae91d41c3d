// Package vmfork is fork(2) for full QEMU/KVM virtual machines.
//
// The model has one primitive, fork, and a few nouns:
//
//   - A machine is a running or stopped VM that vmfork manages. Its record
//     (machine.json), disk overlay, sockets and logs live in
//     <state-dir>/machines/<name>/, and its guest RAM lives in a file on tmpfs,
//     <mem-dir>/<name>.ram, mapped share=on so that the RAM can be frozen
//     without copying it through QEMU.
//   - A parent (source) is the machine a fork was taken from.
//   - A template is a frozen fork point: the parent's device state, its disk
//     image as it was at the fork (read-only from then on) and a frozen copy of
//     its RAM (<mem-dir>/<template>.ram), which is never written again.
//   - A child is a machine started from a template: its disk is a qcow2 overlay
//     on the template's frozen disk, and its RAM maps the template's RAM file
//     share=off, so it costs only the pages it changes.
//
// QEMU processes outlive the CLI: a machine keeps running after the command
// that booted it returns, and later commands find it through its record, its
// PID and its QMP and guest-agent sockets.
//
// The Manager holds the verbs, which cmd/vmfork's commands call:
//
//   - machines: Boot, List and Get, Exec, Stop, Start (boots a stopped
//     machine again from its disk), Remove, SetTTL (extend);
//   - forks: Fork, Explore (one branch per try, the winner kept), Tree;
//   - instants kept as templates: Keep and Unkeep (template save and rm),
//     Templates, SetPool, Export and Import; Checkpoint, Checkpoints and
//     Rewind; Hibernate and Resume;
//   - upkeep: Recover (finishes or undoes what a killed command left, from
//     the journal), GC and Reap (remove what is due), RunReaper and
//     EnsureReaper (the process that removes machines and kept templates
//     when their TTL ends). After a host restart no repair by hand is
//     needed: ls says why each machine is stopped, and kept templates whose
//     RAM went are refused and given up by GC (restart.go).
//
// Each verb that changes something is planned, then applied: its plan
// resolves and checks the request once, the apply takes that plan, and
// PlanX (PlanFork, PlanHibernate, ...) renders the same plan for --dry-run
// (plan.go). The Manager keeps the state store consistent and leaves the
// hypervisor work to a Driver: qemudrv, the embedded default, or
// libvirtdrv. Drivers are wired in explicitly by cmd/vmfork; this package
// never imports one.
package vmfork
