package libvirtdrv

import (
	"encoding/xml"
	"fmt"
	"strings"

	"libvirt.org/go/libvirtxml"
)

// MetadataNS is the XML namespace of vmfork's element in a domain's
// <metadata>. libvirt keeps one top-level element per namespace there and
// hands it back untouched, which makes it the place for what vmfork and its
// start hook need to know about a domain.
const MetadataNS = "urn:vmfork:libvirt:1"

// metadataPrefix is the prefix written; readers match the namespace, not it.
const metadataPrefix = "vmfork"

// Metadata is vmfork's element in a domain's <metadata>. MachineDir marks a
// domain as the machine whose record lives there, so vmfork never mistakes
// (or destroys) a foreign domain that happens to have the same name.
type Metadata struct {
	// No namespace here: libvirt's virDomainGetMetadata returns the element
	// without one; metadataOf matches the namespace itself.
	XMLName    xml.Name `xml:"machine"`
	Machine    string   `xml:"name"`
	MachineDir string   `xml:"dir"`
	Parent     string   `xml:"parent,omitempty"`
	Template   string   `xml:"template,omitempty"`
	// TemplateRAM is set on fork children only: the frozen RAM file that the
	// start hook links to where libvirt tells QEMU to find guest RAM.
	TemplateRAM string `xml:"template-ram,omitempty"`
	// MappedRAM is set instead on a fork child that vmfork remaps onto the
	// template (its RAM mapped shared from a fresh file, then privately
	// from the template): the start hook must link nothing there, and one
	// too old to know this field does not.
	MappedRAM string `xml:"mapped-ram,omitempty"`
	// URI is the libvirt URI the driver used, for the release hook's reaper.
	URI string `xml:"uri,omitempty"`
}

// element renders md as the one element libvirt accepts under <metadata>:
// namespaced and prefixed. encoding/xml cannot write prefixes, so this is
// written by hand from escaped values.
func (md Metadata) element() string {
	var b strings.Builder
	fmt.Fprintf(&b, "<%s:machine xmlns:%s=%q>", metadataPrefix, metadataPrefix, MetadataNS)
	field := func(name, v string) {
		if v == "" {
			return
		}
		fmt.Fprintf(&b, "<%s:%s>", metadataPrefix, name)
		xml.EscapeText(&b, []byte(v))
		fmt.Fprintf(&b, "</%s:%s>", metadataPrefix, name)
	}
	field("name", md.Machine)
	field("dir", md.MachineDir)
	field("parent", md.Parent)
	field("template", md.Template)
	field("template-ram", md.TemplateRAM)
	field("mapped-ram", md.MappedRAM)
	field("uri", md.URI)
	fmt.Fprintf(&b, "</%s:machine>", metadataPrefix)
	return b.String()
}

// setMetadata replaces every element of d's <metadata> with md: a child must
// not inherit its parent's marks.
func setMetadata(d *libvirtxml.Domain, md Metadata) {
	d.Metadata = &libvirtxml.DomainMetadata{XML: md.element()}
}

// metadataOf returns vmfork's element of d, or nil when d has none.
func metadataOf(d *libvirtxml.Domain) *Metadata {
	if d.Metadata == nil || !strings.Contains(d.Metadata.XML, MetadataNS) {
		return nil
	}
	return findMetadata(d.Metadata.XML, MetadataNS)
}

// parseMetadata parses the element virDomainGetMetadata returns for
// MetadataNS: vmfork's element, stripped of its namespace.
func parseMetadata(element string) *Metadata { return findMetadata(element, "") }

// findMetadata returns the first <machine> element in namespace ns of x.
func findMetadata(x, ns string) *Metadata {
	dec := xml.NewDecoder(strings.NewReader(x))
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil
		}
		se, ok := tok.(xml.StartElement)
		if !ok || se.Name.Space != ns || se.Name.Local != "machine" {
			continue
		}
		var md Metadata
		if err := dec.DecodeElement(&md, &se); err != nil {
			return nil
		}
		return &md
	}
}
