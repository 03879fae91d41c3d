package main

import (
	"context"
	"fmt"

	"github.com/sirupsen/logrus"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/libvirtdrv"
)

// reprober is the libvirt driver's timing of its capability cache.
type reprober interface {
	Reprobes(ctx context.Context) (string, error)
}

// libvirtHostProblems says, one line each, what on this host makes libvirt
// slow or unable to run vmfork's domains: a /dev/kvm its QEMU user cannot
// open, and a libvirtd that re-probes QEMU on every call. drv may be nil
// (then only the files are checked).
func libvirtHostProblems(ctx context.Context, drv vmfork.Driver) []string {
	problems := []string{}
	if s, ok := drv.(interface{ SessionProblem() (string, bool) }); ok && isSession(s) {
		// QEMU runs as the user there: libvirt-qemu's access to /dev/kvm
		// is not the question, the session's RAM directory is.
		if p, _ := s.SessionProblem(); p != "" {
			problems = append(problems, p)
		}
	} else if p, err := libvirtdrv.KVMProblem(libvirtdrv.KVMDevice, libvirtdrv.DefaultQEMUConf); err != nil {
		problems = append(problems, err.Error())
	} else if p != "" {
		problems = append(problems, p)
	}
	if r, ok := drv.(reprober); ok {
		if p, err := r.Reprobes(ctx); err != nil {
			problems = append(problems, err.Error())
		} else if p != "" {
			problems = append(problems, p)
		}
	}
	return problems
}

// openLibvirt connects to uri (qemu:///system when empty) with the libvirt
// driver, or says why this binary cannot.
func openLibvirt(uri, verb string) (vmfork.Driver, error) {
	if uri == "" {
		uri = "qemu:///system"
	}
	if newLibvirtDriver == nil {
		return nil, fmt.Errorf("%s: this vmfork was built without libvirt support: %w", verb, vmfork.ErrUnsupported)
	}
	return newLibvirtDriver(uri, logrus.NewEntry(logrus.StandardLogger()))
}

// closeDriver closes drv when it holds a connection.
func closeDriver(drv vmfork.Driver) {
	if c, ok := drv.(interface{ Close() error }); ok {
		c.Close()
	}
}

// isSession reports whether the driver talks to a user's session daemon.
func isSession(s interface{ SessionProblem() (string, bool) }) bool {
	_, session := s.SessionProblem()
	return session
}
