package mcpserver

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/vmfork/vmfork"
)

// The tools that only look: ls, tree, ledger. They show what the agent
// made and the sources it was given, nothing else of the host.

// LsIn is the ls tool's input (none).
type LsIn struct{}

// TreeIn is the tree tool's input.
type TreeIn struct {
	Name string `json:"name,omitempty" jsonschema:"a machine or checkpoint: only its family; default: everything you can see"`
}

// LedgerIn is the ledger tool's input.
type LedgerIn struct {
	Name string `json:"name" jsonschema:"a machine you made or a source: its family's ledger of claimed side effects"`
}

// MachineView is one machine as ls shows it to an agent.
type MachineView struct {
	Name     string       `json:"name"`
	State    vmfork.State `json:"state"`
	Source   bool         `json:"source,omitempty"` // given by the operator, read-only
	Parent   string       `json:"parent,omitempty"`
	Created  time.Time    `json:"created"`
	Expires  time.Time    `json:"expires,omitzero"`
	TTLLeftS float64      `json:"ttl_left_s,omitempty"`
}

func (s *Server) registerView() {
	ro := &mcp.ToolAnnotations{ReadOnlyHint: true}
	tool(s, &mcp.Tool{Name: "ls", Description: "List the machines you made and the sources the operator gave (read-only), with state and TTL left; your checkpoints; and the limits in force.", Annotations: ro}, s.ls)
	tool(s, &mcp.Tool{Name: "tree", Description: "The lineage of what you can see: sources, the fork points (templates) taken from them, your machines and checkpoints, with the memory and disk each holds on its own.", Annotations: ro}, s.tree)
	if s.ledger != nil {
		tool(s, &mcp.Tool{Name: "ledger", Description: "The family ledger of a machine's family: the side effects (keys) programs in its machines claimed, who holds each, and whether it was done.", Annotations: ro}, s.ledgerTool)
	}
}

func (s *Server) register() {
	s.registerMake()
	s.registerGuest()
	s.registerView()
}

// visible reports whether the agent may see machine or template name.
func (s *Server) visible(name string) bool {
	return s.lim.isSource(name) || s.own.owns("machine", name) || s.own.owns("checkpoint", name)
}

func (s *Server) ls(ctx context.Context, req *mcp.CallToolRequest, _ LsIn) (any, error) {
	s.dropOrphanCheckpoints(ctx)
	ms, err := s.mg.List(ctx)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	views := []MachineView{}
	for _, m := range ms {
		src := s.lim.isSource(m.Name)
		if !src && !s.own.owns("machine", m.Name) {
			continue
		}
		v := MachineView{Name: m.Name, State: m.State, Source: src, Parent: m.Parent, Created: m.Created, Expires: m.Expires}
		if !m.Expires.IsZero() {
			v.TTLLeftS = vmfork.TTLLeft(m.Expires, now).Seconds()
		}
		views = append(views, v)
	}
	cps := []map[string]string{}
	for name, machine := range s.own.checkpoints() {
		cps = append(cps, map[string]string{"name": name, "machine": machine})
	}
	slices.SortFunc(cps, func(a, b map[string]string) int { return cmpString(a["name"], b["name"]) })
	return map[string]any{
		"machines":    views,
		"checkpoints": cps,
		"limits": map[string]any{
			"sources": s.lim.Sources, "max_machines": s.lim.MaxMachines, "max_children": s.lim.MaxChildren,
			"ttl_default_s": s.lim.TTLDefault.Seconds(), "ttl_max_s": s.lim.TTLMax.Seconds(),
			"exec_allow": s.lim.ExecAllow, "contract": s.lim.Contract,
		},
	}, nil
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// dropOrphanCheckpoints gives up the agent's checkpoints whose machine is
// gone (removed, or reaped by its TTL): nothing the agent may touch could
// use them, and kept templates have no TTL of their own.
func (s *Server) dropOrphanCheckpoints(ctx context.Context) {
	for name, machine := range s.own.checkpoints() {
		if machine != "" && s.own.owns("machine", machine) {
			continue
		}
		if _, err := s.mg.Unkeep(ctx, name); err != nil {
			s.mg.Log.WithField("checkpoint", name).WithError(err).Warn("could not drop an agent's checkpoint whose machine is gone")
			continue
		}
		s.own.forget(name)
	}
}

func (s *Server) tree(ctx context.Context, req *mcp.CallToolRequest, in TreeIn) (any, error) {
	if in.Name != "" && !s.visible(in.Name) {
		return nil, s.notOwned(in.Name)
	}
	tr, err := s.mg.Tree(ctx, in.Name)
	if err != nil {
		return nil, err
	}
	var roots []*vmfork.TreeNode
	for _, r := range tr.Roots {
		if n := s.prune(r); n != nil {
			roots = append(roots, n)
		}
	}
	return map[string]any{"roots": roots}, nil
}

// prune returns n's tree with only what the agent may see: its machines
// and checkpoints, the sources, and the fork points between them (a
// template holds the agent's children). A machine the agent may not see
// that lies on the way is shown without its name.
func (s *Server) prune(n *vmfork.TreeNode) *vmfork.TreeNode {
	var kids []*vmfork.TreeNode
	for _, c := range n.Children {
		if p := s.prune(c); p != nil {
			kids = append(kids, p)
		}
	}
	seen := false
	switch n.Kind {
	case vmfork.NodeTemplate:
		seen = n.Kept != "" && s.visible(n.Kept)
	default:
		seen = s.visible(n.Name)
	}
	if !seen && len(kids) == 0 {
		return nil
	}
	out := *n
	out.Children = kids
	if !seen {
		if n.Kind != vmfork.NodeTemplate {
			out.Name = "(not yours)"
		}
		out.Kept, out.Contract = "", nil
	}
	return &out
}

func (s *Server) ledgerTool(ctx context.Context, req *mcp.CallToolRequest, in LedgerIn) (any, error) {
	if err := vmfork.ValidateName(in.Name); err != nil {
		return nil, err
	}
	if !s.visible(in.Name) {
		return nil, s.notOwned(in.Name)
	}
	family, err := s.mg.FamilyOf(in.Name)
	if err != nil {
		return nil, err
	}
	recs, err := s.ledger.List(ctx, family)
	if err != nil {
		return nil, fmt.Errorf("ledger of %q: %w", in.Name, err)
	}
	return map[string]any{"family": family, "records": recs}, nil
}
