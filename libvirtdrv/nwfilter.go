//go:build cgo

package libvirtdrv

import (
	"context"
	"errors"
	"fmt"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"
)

// A machine's network contract on a libvirt network is a network filter
// (nwfilter) of its own, made by egress.NWFilterXML and referenced by the
// domain's interface (filterRef): libvirt's own mechanism, so the rules
// are what virsh nwfilter-list and the domain XML show, libvirt applies
// them when the interface comes up and removes them with it, and a
// redefined filter is re-applied in place to the interfaces that use it
// (vmfork contract NAME --set).

// defineFilter defines network filter name from xml, or redefines it in
// place when it exists. xml must name the filter name: libvirt defines
// by the name inside the XML, and a mismatch would define another filter.
func defineFilter(ctx context.Context, conn *libvirt.Connect, name, xml string) error {
	var def libvirtxml.NWFilter
	if err := def.Unmarshal(xml); err != nil {
		return fmt.Errorf("define network filter %s: %w", name, err)
	}
	if def.Name != name {
		return fmt.Errorf("define network filter %s: the XML names filter %q", name, def.Name)
	}
	return bounded(ctx, "virNWFilterDefineXML", func() error {
		// libvirt redefines a filter only under its UUID: a definition
		// without one is a new filter, refused as a duplicate name.
		old, err := conn.LookupNWFilterByName(name)
		switch {
		case err == nil:
			uuid, err := old.GetUUIDString()
			old.Free()
			if err != nil {
				return fmt.Errorf("define network filter %s: %w", name, wrap(err))
			}
			def.UUID = uuid
			if xml, err = def.Marshal(); err != nil {
				return fmt.Errorf("define network filter %s: %w", name, err)
			}
		case !errors.Is(err, libvirt.ERR_NO_NWFILTER):
			return fmt.Errorf("define network filter %s: %w", name, wrap(err))
		}
		f, err := conn.NWFilterDefineXML(xml)
		if err != nil {
			return fmt.Errorf("define network filter %s: %w", name, wrap(err))
		}
		f.Free()
		return nil
	})
}

// undefineFilter removes network filter name. It is idempotent: a filter
// that does not exist is no error. libvirt refuses to remove a filter an
// interface still references, so undefine it after the domain is gone.
func undefineFilter(ctx context.Context, conn *libvirt.Connect, name string) error {
	return bounded(ctx, "virNWFilterUndefine", func() error {
		f, err := conn.LookupNWFilterByName(name)
		if errors.Is(err, libvirt.ERR_NO_NWFILTER) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("remove network filter %s: %w", name, wrap(err))
		}
		defer f.Free()
		if err := f.Undefine(); err != nil && !errors.Is(err, libvirt.ERR_NO_NWFILTER) {
			return fmt.Errorf("remove network filter %s: %w", name, wrap(err))
		}
		return nil
	})
}

// filterRef is the <filterref filter='NAME'/> of a domain interface that
// puts filter name on it.
func filterRef(name string) *libvirtxml.DomainInterfaceFilterRef {
	return &libvirtxml.DomainInterfaceFilterRef{Filter: name}
}
