//go:build !cgo

package main

import (
	"github.com/sirupsen/logrus"

	"github.com/vmfork/vmfork"
)

// newLibvirtDriver is nil in a CGO_ENABLED=0 build: a QEMU-only binary
// (driver_libvirt.go wires libvirt into cgo builds).
var newLibvirtDriver func(uri string, log *logrus.Entry) (vmfork.Driver, error)
