//go:build !cgo

package bench

import (
	"fmt"

	"github.com/sirupsen/logrus"

	"github.com/vmfork/vmfork"
)

func newLibvirtDriver(uri string, log *logrus.Entry) (vmfork.Driver, error) {
	return nil, fmt.Errorf("libvirt driver at %s: this vmfork was built without cgo, so without libvirt: %w", uri, vmfork.ErrUnsupported)
}

const libvirtSourceXMLFile = ""
