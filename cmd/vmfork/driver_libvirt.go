//go:build cgo

package main

import (
	"github.com/sirupsen/logrus"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/libvirtdrv"
)

// newLibvirtDriver wires the libvirt driver into cgo builds; libvirtdrv
// links libvirt through cgo. driver_nolibvirt.go is the other half.
var newLibvirtDriver = func(uri string, log *logrus.Entry) (vmfork.Driver, error) {
	return libvirtdrv.New(uri, log)
}
