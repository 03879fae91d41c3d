package vmfork

import (
	"context"
	"fmt"
	"github.com/vmfork/vmfork/contract"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/vmfork/vmfork/overlay"
	"github.com/vmfork/vmfork/sharedmem"
)

// The lineage tree: machines and templates as one family tree. A machine's
// children are the templates frozen from it; a template's children are the
// machines forked from it. A machine that was removed while a template
// frozen from it lives on shows as a removed node in its place, found
// through the template's record of its source's lineage.

// NodeKind says what a tree node is.
type NodeKind string

// Node kinds.
const (
	NodeMachine  NodeKind = "machine"
	NodeTemplate NodeKind = "template"
	NodeRemoved  NodeKind = "removed" // a machine gone, whose templates live on
)

// TreeNode is one machine or template with what it holds on its own. Its
// JSON form is vmfork tree's.
type TreeNode struct {
	Kind NodeKind `json:"kind"`
	// Name is a machine's name or a template's id; Kept is a kept
	// template's name.
	Name    string    `json:"name"`
	Kept    string    `json:"kept_as,omitempty"`
	State   State     `json:"state,omitempty"`
	Created time.Time `json:"created,omitzero"`
	AgeS    float64   `json:"age_s,omitempty"`
	Expires time.Time `json:"expires,omitzero"`
	TTLS    float64   `json:"ttl_left_s,omitempty"`
	// RAMBytes is the memory the node holds on its own: a running machine's
	// private dirty resident memory (what it wrote that no other process
	// shares), a
	// template's frozen RAM file. DiskBytes is its own top disk image.
	RAMBytes  int64 `json:"ram_bytes"`
	DiskBytes int64 `json:"disk_bytes"`
	// Contract is a machine's contract, or the one a template gives its
	// children (contracts.go).
	Contract *contract.Contract `json:"contract,omitempty"`
	Children []*TreeNode        `json:"children,omitempty"`
}

// Tree is the lineage of every machine and template, or of one family.
type Tree struct {
	Roots []*TreeNode `json:"roots"`
	// SavedBytes is what sharing saves: each child of a template would
	// otherwise hold a copy of the template's RAM and disk of its own.
	SavedBytes int64 `json:"saved_bytes"`
	// HeldBytes is what every node holds on its own, summed.
	HeldBytes int64 `json:"held_bytes"`
}

// treeInput is what a tree is built from, so it can be built from fakes.
type treeInput struct {
	machines  []*Machine
	templates []*Template
	now       time.Time
	ram       func(*Machine) int64
	disk      func(path string) int64
}

// Tree returns the lineage tree; with name set, only the family (the
// whole tree from its root) that machine or template name belongs to.
func (mg *Manager) Tree(ctx context.Context, name string) (*Tree, error) {
	ms, err := mg.List(ctx)
	if err != nil {
		return nil, err
	}
	ts, err := mg.Store.ListTemplates()
	if err != nil {
		return nil, err
	}
	in := treeInput{machines: ms, templates: ts, now: time.Now(), ram: privateRAM, disk: allocated}
	tr := buildTree(in)
	if name == "" {
		return tr, nil
	}
	for _, r := range tr.Roots {
		if r.find(name) {
			return summarize(&Tree{Roots: []*TreeNode{r}}, in), nil
		}
	}
	return nil, fmt.Errorf("tree: machine or template %q: %w", name, ErrNotFound)
}

func privateRAM(m *Machine) int64 {
	if m.State == StateStopped || m.PID == 0 {
		return 0
	}
	r, err := sharedmem.ReadRollup(m.PID)
	if err != nil {
		return 0
	}
	// Private clean pages are mostly the template's RAM file, read but
	// not written: they are the template's, not the machine's.
	return r.PrivateDirty
}

func allocated(path string) int64 {
	if path == "" {
		return 0
	}
	n, _ := overlay.AllocatedBytes(path)
	return n
}

func (n *TreeNode) find(name string) bool {
	if n.Name == name || n.Kept == name {
		return true
	}
	for _, c := range n.Children {
		if c.find(name) {
			return true
		}
	}
	return false
}

func buildTree(in treeInput) *Tree {
	machines := map[string]*TreeNode{}
	tpls := map[string]*TreeNode{}
	for _, m := range in.machines {
		if m.State == StatePooled {
			continue // a warm-pool process is not a machine of its own yet
		}
		n := &TreeNode{Kind: NodeMachine, Name: m.Name, State: m.State, Created: m.Created, Expires: m.Expires, Contract: m.Contract}
		n.RAMBytes = in.ram(m)
		if m.Spec.Disk != "" {
			n.DiskBytes = in.disk(m.Paths.Disk)
		}
		machines[m.Name] = n
	}
	byID := map[string]*Template{}
	for _, t := range in.templates {
		byID[t.ID] = t
		n := &TreeNode{Kind: NodeTemplate, Name: t.ID, Kept: t.Name, Created: t.Created, Contract: t.Contract}
		if t.Name != "" {
			n.Expires = t.Expires // a given-up template's deadline has done its work
		}
		if t.HasMemory {
			n.RAMBytes = in.disk(t.Paths.RAM)
			if t.RAMDelta != nil {
				n.RAMBytes = in.disk(t.RAMDelta.Pages) // the base is another's
			}
		}
		if !t.ForeignDisk {
			n.DiskBytes = in.disk(t.Paths.Disk)
		}
		tpls[t.ID] = n
	}
	// A template whose source is gone gets a removed node in its place,
	// under the source's own template or parent when those live on.
	removed := map[string]*TreeNode{}
	lineage := map[string][2]string{} // removed machine -> its parent, template
	for _, t := range in.templates {
		if _, ok := machines[t.Source]; ok {
			continue
		}
		if _, ok := removed[t.Source]; !ok {
			removed[t.Source] = &TreeNode{Kind: NodeRemoved, Name: t.Source}
			lineage[t.Source] = [2]string{t.SourceParent, t.SourceTemplate}
		}
	}
	var roots []*TreeNode
	attach := func(n *TreeNode, tpl, parent string) {
		if p, ok := tpls[tpl]; ok && tpl != "" {
			p.Children = append(p.Children, n)
		} else if p, ok := machines[parent]; ok && parent != "" {
			p.Children = append(p.Children, n)
		} else if p, ok := removed[parent]; ok && parent != "" {
			p.Children = append(p.Children, n)
		} else {
			roots = append(roots, n)
		}
	}
	for _, m := range in.machines {
		if n, ok := machines[m.Name]; ok {
			attach(n, m.Template, m.Parent)
		}
	}
	for name, n := range removed {
		l := lineage[name]
		attach(n, l[1], l[0])
	}
	for _, t := range in.templates {
		n := tpls[t.ID]
		if p, ok := machines[t.Source]; ok {
			p.Children = append(p.Children, n)
		} else {
			removed[t.Source].Children = append(removed[t.Source].Children, n)
		}
	}
	tr := &Tree{Roots: roots}
	sortNodes(tr.Roots)
	return summarize(tr, in)
}

// summarize fills ages, TTLs and the totals.
func summarize(tr *Tree, in treeInput) *Tree {
	tr.SavedBytes, tr.HeldBytes = 0, 0
	var walk func(n *TreeNode)
	walk = func(n *TreeNode) {
		if !n.Created.IsZero() {
			n.AgeS = in.now.Sub(n.Created).Round(time.Second).Seconds()
		}
		n.TTLS = TTLLeft(n.Expires, in.now).Seconds()
		tr.HeldBytes += n.RAMBytes + n.DiskBytes
		if n.Kind == NodeTemplate {
			users := 0
			for _, c := range n.Children {
				if c.Kind == NodeMachine && c.State != StateStopped {
					users++
				}
			}
			if users > 1 {
				tr.SavedBytes += int64(users-1) * (n.RAMBytes + n.DiskBytes)
			}
		}
		for _, c := range n.Children {
			walk(c)
		}
	}
	for _, r := range tr.Roots {
		walk(r)
	}
	return tr
}

func sortNodes(ns []*TreeNode) {
	sort.Slice(ns, func(i, j int) bool {
		if !ns[i].Created.Equal(ns[j].Created) {
			return ns[i].Created.Before(ns[j].Created)
		}
		return ns[i].Name < ns[j].Name
	})
	for _, n := range ns {
		sortNodes(n.Children)
	}
}

// Render writes the tree as text, one node a line:
//
//	web  running  age 5m  ram 120.0M  disk 3.1M
//	└─ web.1  template  age 4m  ram 98.2M  disk 2.0M
//	   ├─ web-1  running  age 4m  ttl 56s  ram 12.0M  disk 0.2M
func (tr *Tree) Render(w io.Writer) error {
	var b strings.Builder
	var walk func(n *TreeNode, prefix, branch string)
	walk = func(n *TreeNode, prefix, branch string) {
		b.WriteString(prefix + branch + n.line() + "\n")
		next := prefix
		switch branch {
		case "├─ ":
			next += "│  "
		case "└─ ":
			next += "   "
		}
		for i, c := range n.Children {
			if i == len(n.Children)-1 {
				walk(c, next, "└─ ")
			} else {
				walk(c, next, "├─ ")
			}
		}
	}
	for _, r := range tr.Roots {
		walk(r, "", "")
	}
	fmt.Fprintf(&b, "held %s on their own; sharing saves %s\n", mib(tr.HeldBytes), mib(tr.SavedBytes))
	_, err := io.WriteString(w, b.String())
	return err
}

func (n *TreeNode) line() string {
	var f []string
	switch n.Kind {
	case NodeTemplate:
		name := n.Name
		if n.Kept != "" {
			name = n.Kept + " (" + n.Name + ")"
		}
		f = append(f, name, "template")
	case NodeRemoved:
		return n.Name + "  removed"
	default:
		f = append(f, n.Name, string(n.State))
	}
	f = append(f, "age "+(time.Duration(n.AgeS)*time.Second).String())
	if n.TTLS > 0 {
		f = append(f, "ttl "+(time.Duration(n.TTLS)*time.Second).String())
	} else if !n.Expires.IsZero() {
		f = append(f, "ttl expired")
	}
	f = append(f, "ram "+mib(n.RAMBytes), "disk "+mib(n.DiskBytes))
	return strings.Join(f, "  ")
}

func mib(b int64) string { return fmt.Sprintf("%.1fM", float64(b)/(1<<20)) }
