//go:build cgo

package bench

import (
	"github.com/sirupsen/logrus"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/libvirtdrv"
)

// The libvirt driver links libvirt through cgo; lvdriver_nocgo.go is the
// other half, as in cmd/vmfork.

func newLibvirtDriver(uri string, log *logrus.Entry) (vmfork.Driver, error) {
	return libvirtdrv.New(uri, log)
}

// libvirtSourceXMLFile is the source's migratable XML in a template's
// directory, which a child's XML is made from.
const libvirtSourceXMLFile = libvirtdrv.FileSourceXML
