// Package tests holds vmfork's integration tests and benchmarks. They boot the
// project's test guest (tests/guest) under real QEMU, with KVM when /dev/kvm
// is usable and TCG otherwise, and talk to its real qemu-guest-agent. They are
// behind the "integration" build tag so that `go test ./...` boots nothing:
//
//	make integration
//
// which is `go test -tags integration ./tests/...` with VMFORK_BIN pointing at
// a built vmfork binary and VMFORK_GUEST at the built guest. A missing
// prerequisite fails the tests; they never skip because KVM is absent.
//
// # Parallel
//
// Tests that own all they use call parallel(t) (t.Parallel() and a slot of
// the scheduler in schedule_test.go), and most do: go test runs them after
// the others. make integration lifts go test's own limit (-parallel 64) and
// the scheduler runs four at once (VMFORK_TEST_SLOTS), the longest expected
// first, so that the Debian variants and the conformance suites do not
// queue behind everything else and run alone at the end. A test whose
// subtests are parallel calls parallelParent(t): it holds no slot, its
// subtests take theirs. Tests that read timing inside the guest
// (TestIdentityReproducible, TestIdentityClock), bound a reaper's delay
// (the TTL tests), measure pauses (the bench stall smokes), set the
// environment or change host-wide settings (libvirt setup) run alone,
// first. A guest under TCG keeps a core busy only while it works, and tests
// wait on guests, timers and daemons much of the time, so four at once
// fill a 2-core host that one at a time left a quarter idle. Such a test
// owns everything it uses (its env's state and mem dirs, its domain prefix,
// its network namespace, its libvirt network's subnet: newLibvirtNet),
// never calls t.Setenv (env.withEnv gives its vmfork commands a variable)
// and changes host-wide files only under a lock (hostsEntry).
//
// # Shared Debian template
//
// Booting the Debian guest and waiting for systemd costs 35-40 s of TCG CPU;
// a fork of a kept template of it, about 4 s. So a test process boots the
// Debian guest on QEMU's user network (variant ifupdown-nodbus, debianMemory)
// once, on the first test that asks for it and never if none does: the
// fixture (harness_shared_test.go) settles it in a store of its own, keeps it
// as template debian-base, exports that to an archive and removes the
// template and the machine, so nothing of it runs; TestMain removes the
// archive when the tests end. A test gets a settled Debian machine with
// debianEnv.forkDebian(NAME): the archive is imported into the test's own
// store once and NAME forked from it, a child with its own identity
// (hostname NAME, new MAC and DHCP lease, machine-id). Concurrent callers wait
// for the one boot; if it failed, each fails with its error. Tests whose
// Debian source must sit on their own bridge, or boot under libvirt (an
// archive imports under the driver that exported it), still boot it.
//
// # More than one host
//
// newHostRig (hosts_test.go) makes two "hosts" on this machine for
// template push and pull: two network namespaces joined by a veth pair and
// nothing else, each with an sshd of its own (key auth only, keys the test
// makes), its own state and mem dir, and every vmfork the test runs for a
// host runs in its namespace (env.runAs). One kernel, one QEMU build and one
// page cache are shared: docs/TEMPLATES.md says what that does and does not
// simulate. The namespaces go last, after the hosts' QEMUs and sshds.
package tests
