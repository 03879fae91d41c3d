// Package customize gives a fork child an identity of its own before it is
// let onto the network. A fork is a perfect copy: every child wakes with its
// source's MAC, addresses, hostname, clock, machine-id, SSH host keys and
// random-number state. The steps here change what must differ, through the
// guest agent, VMware-Instant-Clone style.
//
// # Chains and steps
//
// A Chain is a named, ordered list of Steps, edited like
// firecracker-go-sdk's handler lists: Append, Prepend, AppendAfter, Swap,
// Remove and WithTimeout return a new Chain and never change the one they
// are called on. Step names are namespaced: vmfork's own start with
// "vmfork.", and steps from a spec file must use a namespace of their own
// ("acme.register"). Variants rewrite the list instead of growing branches
// inside steps: Reproducible swaps the clock and RNG steps for ones that keep
// the template's state, Booted does the same for a child that booted fresh.
//
// Run runs a chain's steps in order, each under its own timeout, and
// reports what each did (Result). A step ends in one of three ways: it did
// its work (ok), it had nothing to do or was told not to (skipped, with the
// reason), or it failed. The first failure ends the run; the steps after it
// are reported not_run. A failed step's guest command, such as a hook,
// brings its exit code and the tail of its stderr (ExitError).
//
// The default chain, in order:
//
//	vmfork.agent          wait until the guest agent answers
//	vmfork.clock          move the guest clock to host time (date -s by the offset, or guest-set-time)
//	vmfork.rng            confirm that the kernel reseeded its CRNG from the new vmgenid
//	vmfork.hostname       set the hostname from a pattern (web-{n}): hostnamectl, or the files
//	vmfork.machine-id     write a new /etc/machine-id (and a D-Bus copy); restart journald
//	vmfork.ssh-host-keys  new SSH host keys of the guest's kinds, made on the host; sshd reloaded
//	vmfork.network        stop the inherited DHCP client without a release, flush, new MAC,
//	                      a fresh lease by what configured the NIC (or a static address),
//	                      exactly one IPv4 address, a gratuitous ARP
//	vmfork.hooks          run /etc/vmfork/post-fork.d/* in name order
//
// A child with a fork contract (package contract) gets the contract's
// guest steps too, added by the caller: vmfork.connections (its inherited
// TCP connections closed), vmfork.secret-files.wipe and
// vmfork.secret-files.rotate (files of its parent's secrets deleted, or
// rewritten with its own value: secretfiles.go), all before vmfork.network,
// and vmfork.secrets (its brokered secrets' placeholders) before
// vmfork.hooks.
//
// The order matters. Everything another machine could see of the child
// (hostname, machine-id, host keys) changes before the network step, and the
// network step changes the MAC before any packet leaves. systemd-networkd
// derives its DHCP client identifier from the machine-id, so machine-id
// comes before network, which restarts networkd. The caller keeps the NIC
// link down until the chain has finished; only DHCP needs the link earlier,
// so the network step raises it itself, once the MAC is new.
//
// Every step picks its mechanism from what the guest has, and its detail
// names the one it used. A step that cannot do its job fails with one line
// that names what the guest lacks and what to do (install it, or
// --skip-step NAME), not with a tool's raw output alone.
//
// Steps reach the guest only through the Agent interface (a subset of
// qmp.Agent) and the host-side Link; they know nothing of vmfork's machines.
// Steps that work in the guest give their shell code to Run as Parts, and
// Run joins consecutive ones into one guest command (batch.go): a chain
// runs two commands in the guest in DHCP mode (one with the link down, one
// with it up), not one per step, because every command costs a round trip
// and a process start, tens of milliseconds each in a fresh fork child
// under TCG. The scripts use /bin/sh, shell builtins where they can, and the
// usual tools (ip, dmesg); a part exits 100 to say "nothing to do here",
// with the reason on stdout.
//
// Every guest script of more than a line or two is a file of its own in
// scripts/ (network-down.sh, hostname.sh, batch-head.sh, ...), embedded with
// go:embed (guestscripts.go). Each opens with its contract: what it is for,
// how it runs (a batch part in a subshell, an inline one, or a command of
// its own), its arguments, environment and input, its output and exit
// codes, and what it must not touch. The guest gets the script without
// that comment. make shellcheck (part of make test) checks the files as
// POSIX sh, for busybox ash and dash; TestGuestScripts checks that each is
// used and has its contract.
//
// # Identity modes
//
// Fresh (the default) gives every child a new vmgenid, so the guest kernel
// reseeds its CRNG, and steps its clock to host time. The reseed happens
// when the kernel handles the vmgenid notification, a moment after the
// child resumes; until then the child's CRNG is its siblings'. That is one
// reason the link stays down until the chain, which confirms the reseed,
// has run.
//
// Reproducible keeps the template's vmgenid, clock and RNG state in every
// child, for experiments that must replay exactly: the children's kernels
// resume with the same CRNG state and give the same bytes to the same
// first reads. They drift apart as soon as they consume random bytes in a
// different order: the kernel's own users (kfence sampling, slab freelist
// shuffling) take some at times that depend on host scheduling, and Linux
// reseeds by time from an input pool that holds each child's interrupt
// timings. MACs, hostnames, addresses and machine-ids are made unique in
// both modes.
//
// # Spec files
//
// A Spec says how children are customized; LoadSpec reads one from YAML or
// JSON and rejects unknown keys and bad values, so that a typo fails before
// anything is paused. See Spec for the format.
//
// # Hooks
//
// The guest's own hooks live in /etc/vmfork/post-fork.d (run in each child
// by vmfork.hooks) and /etc/vmfork/pre-fork.d (run in the source before it is
// frozen, to quiesce an application). Like run-parts, only executable files
// whose names consist of letters, digits, "_" and "-" run, in byte order of
// their names; the first that fails stops the rest. They run with PATH and
// VMFORK_NAME, VMFORK_PARENT, VMFORK_INDEX, VMFORK_TEMPLATE, VMFORK_IDENTITY,
// VMFORK_HOSTNAME and VMFORK_MAC in the environment (pre-fork hooks get
// VMFORK_NAME, the source, and VMFORK_EVENT=pre-fork).
package customize
