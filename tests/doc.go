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
package tests
