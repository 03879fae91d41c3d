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
// Tests that own all they use call t.Parallel() (the Debian guest's identity
// and conformance suites, the crash matrices, the flat-pause, fork, template
// and libvirt tests that take longest): go test runs them after the others,
// two at a time (make integration passes -parallel 2). Tests that read
// timing inside the guest (TestIdentityReproducible), set the environment or
// change host-wide settings (libvirt setup) run alone. A guest
// under TCG keeps one core busy, so two at once use a 2-core host without
// slowing each other much, and the suite takes minutes less. Such a test owns
// everything it uses (its env's state and mem dirs, its domain prefix, its
// network namespace) and never calls t.Setenv or changes host-wide settings.
package tests
