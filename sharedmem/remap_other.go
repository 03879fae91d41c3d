//go:build !amd64

package sharedmem

import "errors"

// RemapSupported reports whether Remap works on this build: the system call
// injection it uses is written for x86-64 registers.
const RemapSupported = false

// Remap is not available on this architecture.
func Remap(m Mapping, fd, blockFD int) error {
	return errors.New("remapping guest RAM needs x86-64")
}

// CanRemap always fails on this architecture.
func CanRemap(pid int) error { return errors.New("remapping guest RAM needs x86-64") }

// DropShared always fails on this architecture.
func DropShared(m Mapping, chunk int64) error { return errors.New("remapping guest RAM needs x86-64") }
