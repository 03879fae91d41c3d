package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/contract"
)

// The tools that make or remove machines: fork, explore, checkpoint,
// rewind, rm. Each checks every limit first (nothing changes on a
// refusal), notes what it will make as the agent's (owner.go), then
// calls the Manager once.

// ForkIn is the fork tool's input.
type ForkIn struct {
	Source   string         `json:"source" jsonschema:"machine or kept template to fork: one the operator gave (see ls) or a machine or checkpoint you made"`
	Count    int            `json:"count,omitempty" jsonschema:"how many children (default 1); or give names"`
	Names    []string       `json:"names,omitempty" jsonschema:"the children's names (letters, digits, -); default: generated"`
	TTLS     float64        `json:"ttl_s,omitempty" jsonschema:"seconds each child lives before it is removed (default and maximum set by the operator)"`
	Contract map[string]any `json:"contract,omitempty" jsonschema:"fork contract for the children (network egress, dns, connections, secret_files); it may only narrow the operator's"`
}

// ExploreIn is the explore tool's input.
type ExploreIn struct {
	Source   string         `json:"source" jsonschema:"machine or kept template to branch from"`
	Tries    []string       `json:"tries" jsonschema:"shell commands, one branch each, run with /bin/sh -c"`
	Score    string         `json:"score,omitempty" jsonschema:"shell command run in each branch after its try; the last line of its stdout is a number and the highest wins. Empty: the fastest try that exits 0 wins"`
	KeepAs   string         `json:"keep_as,omitempty" jsonschema:"name to keep the winner as (default: its branch's name)"`
	Watch    []string       `json:"watch,omitempty" jsonschema:"guest directories whose changed files each try lists"`
	TimeoutS float64        `json:"timeout_s,omitempty" jsonschema:"seconds per try and per score command (default 300)"`
	TTLS     float64        `json:"ttl_s,omitempty" jsonschema:"seconds the kept winner lives"`
	Contract map[string]any `json:"contract,omitempty" jsonschema:"fork contract for the branches; it may only narrow the operator's"`
}

// CheckpointIn is the checkpoint tool's input.
type CheckpointIn struct {
	Machine string `json:"machine" jsonschema:"a running machine you made"`
	As      string `json:"as,omitempty" jsonschema:"the checkpoint's name (default MACHINE-cpN)"`
}

// RewindIn is the rewind tool's input.
type RewindIn struct {
	Machine string `json:"machine" jsonschema:"a machine you made"`
	To      string `json:"to" jsonschema:"a checkpoint of it you made"`
}

// RmIn is the rm tool's input.
type RmIn struct {
	Names []string `json:"names" jsonschema:"machines or checkpoints you made"`
}

func (s *Server) registerMake() {
	tool(s, &mcp.Tool{Name: "fork", Description: "Fork a running machine (or a kept template) into children that continue from the same instant: same memory, disk and processes, each with its own identity. " +
		"The source pauses for a fraction of a second. Returns each child's name and time to ready. Children are removed when their TTL passes; rm them sooner when done. " +
		"Reports progress per child; cancelling leaves no half-made child."}, s.fork)
	tool(s, &mcp.Tool{Name: "explore", Description: "Branch-and-explore: fork one branch per try, run each try in its own branch, score them, keep the winner as a machine and remove the rest. " +
		"Returns per try: exit code, stdout/stderr tails, files changed under watch, duration, score; and the winner's name (none if no try won)."}, s.explore)
	tool(s, &mcp.Tool{Name: "checkpoint", Description: "Keep a running machine's instant as a checkpoint, to rewind it to later or to fork from. The machine pauses for a fraction of a second."}, s.checkpoint)
	tool(s, &mcp.Tool{Name: "rewind", Description: "Replace a machine's live state (memory, disk, processes) with a checkpoint of it; it keeps its name and TTL."}, s.rewind)
	tool(s, &mcp.Tool{Name: "rm", Description: "Remove machines or checkpoints you made (machines are killed at once). All names are checked before anything is removed."}, s.rm)
}

// checkSource checks that the agent may fork source: one the operator
// gave, or a machine or checkpoint it made.
func (s *Server) checkSource(source string) error {
	if err := vmfork.ValidateName(source); err != nil {
		return fmt.Errorf("source: %w", err)
	}
	if s.lim.isSource(source) || s.own.owns("machine", source) || s.own.owns("checkpoint", source) {
		return nil
	}
	return limitErr("source", "%q is not a source the operator gave (%v) nor a machine or checkpoint you made", source, s.lim.Sources)
}

// childContract resolves the contract a call's children get: the agent's
// own, checked to narrow the operator's (or the source's, when the
// operator gave none); else the operator's; else nil (the source's).
func (s *Server) childContract(source string, raw map[string]any) (*contract.Contract, error) {
	if raw == nil {
		return s.lim.Contract.Clone(), nil
	}
	data, err := json.Marshal(raw)
	if err != nil {
		return nil, fmt.Errorf("contract: %w", err)
	}
	ag, err := contract.ParseJSON(data)
	if err != nil {
		return nil, err
	}
	base := s.lim.Contract
	if base == nil {
		if base, err = s.sourceContract(source); err != nil {
			return nil, err
		}
	}
	if err := Narrows(base, ag); err != nil {
		return nil, err
	}
	return ag, nil
}

// sourceContract is the contract source's children would inherit.
func (s *Server) sourceContract(source string) (*contract.Contract, error) {
	if m, err := s.mg.Store.LoadMachine(source); err == nil {
		return m.Contract, nil
	} else if !errors.Is(err, vmfork.ErrNotFound) {
		return nil, err
	}
	t, err := s.mg.Store.FindKept(source)
	if err != nil {
		return nil, fmt.Errorf("source %q: %w", source, err)
	}
	return t.Contract, nil
}

// childNames returns the names of n children: the agent's, or the next
// free AGENT-K.
func (s *Server) childNames(names []string, n int) ([]string, error) {
	if len(names) > 0 {
		for _, name := range names {
			if err := vmfork.ValidateName(name); err != nil {
				return nil, fmt.Errorf("names: %w", err)
			}
			if s.lim.isSource(name) {
				return nil, limitErr("source", "%q names one of the operator's sources", name)
			}
		}
		return names, nil
	}
	var out []string
	for len(out) < n {
		name := fmt.Sprintf("%s-%d", s.lim.Agent, s.seq.Add(1))
		_, merr := s.mg.Store.LoadMachine(name)
		_, terr := s.mg.Store.FindKept(name)
		if merr == nil || terr == nil {
			continue
		}
		out = append(out, name)
	}
	return out, nil
}

// branchNames picks a prefix for an explore's n branches whose names
// PREFIX-1..n are all free, so that the Manager names them exactly so and
// they can be noted as the agent's before it forks (branchNames in the
// root package skips taken numbers; a restarted server counts from 1
// again).
func (s *Server) branchNames(n int) (string, []string) {
	for {
		prefix := fmt.Sprintf("%s-x%d", s.lim.Agent, s.seq.Add(1))
		names := make([]string, 0, n+1)
		for i := range n {
			name := fmt.Sprintf("%s-%d", prefix, i+1)
			_, merr := s.mg.Store.LoadMachine(name)
			_, terr := s.mg.Store.FindKept(name)
			if merr == nil || terr == nil {
				names = nil
				break
			}
			names = append(names, name)
		}
		if names != nil {
			return prefix, names
		}
	}
}

func (s *Server) checkCount(n int) error {
	if n > s.lim.MaxChildren {
		return limitErr("max-children", "%d machines in one call; the operator allows %d", n, s.lim.MaxChildren)
	}
	return nil
}

func (s *Server) fork(ctx context.Context, req *mcp.CallToolRequest, in ForkIn) (any, error) {
	n := in.Count
	if len(in.Names) > 0 {
		if in.Count != 0 && in.Count != len(in.Names) {
			return nil, fmt.Errorf("fork: count %d and %d names disagree: %w", in.Count, len(in.Names), vmfork.ErrInvalid)
		}
		n = len(in.Names)
	}
	if n == 0 {
		n = 1
	}
	if n < 0 {
		return nil, fmt.Errorf("fork: count %d: want 1 or more: %w", n, vmfork.ErrInvalid)
	}
	if err := s.checkSource(in.Source); err != nil {
		return nil, err
	}
	if err := s.checkCount(n); err != nil {
		return nil, err
	}
	ttl, err := s.lim.ttl(in.TTLS)
	if err != nil {
		return nil, err
	}
	ct, err := s.childContract(in.Source, in.Contract)
	if err != nil {
		return nil, err
	}
	names, err := s.childNames(in.Names, n)
	if err != nil {
		return nil, err
	}
	release, err := s.own.reserve(n, s.lim.MaxMachines, names, "machine", "")
	if err != nil {
		return nil, err
	}
	defer release()
	ctx = forkTrace(ctx, progress(ctx, req), n)
	res, err := s.mg.Fork(ctx, vmfork.ForkRequest{
		Source: in.Source, Names: names, TTL: ttl, Contract: ct, MaxChildren: s.lim.MaxChildren,
	})
	if res == nil {
		return nil, err
	}
	out := map[string]any{"source": res.Source, "pause_ms": res.PauseMS, "children": res.Children, "ttl_s": ttl.Seconds()}
	if len(res.Failed) > 0 {
		out["failed"] = res.Failed
	}
	if err != nil {
		out["error"] = err.Error()
	}
	return out, nil
}

func (s *Server) explore(ctx context.Context, req *mcp.CallToolRequest, in ExploreIn) (any, error) {
	if err := s.checkSource(in.Source); err != nil {
		return nil, err
	}
	if len(in.Tries) == 0 {
		return nil, fmt.Errorf("explore: tries: give at least one command: %w", vmfork.ErrInvalid)
	}
	if err := s.checkCount(len(in.Tries)); err != nil {
		return nil, err
	}
	if err := s.lim.checkExec([]string{"sh"}); err != nil {
		return nil, limitErr("exec-allow", "explore runs its tries with /bin/sh, which the operator does not allow (%v)", s.lim.ExecAllow)
	}
	ttl, err := s.lim.ttl(in.TTLS)
	if err != nil {
		return nil, err
	}
	if in.TimeoutS < 0 {
		return nil, fmt.Errorf("explore: timeout_s %v: want a positive number: %w", in.TimeoutS, vmfork.ErrInvalid)
	}
	ct, err := s.childContract(in.Source, in.Contract)
	if err != nil {
		return nil, err
	}
	prefix, names := s.branchNames(len(in.Tries))
	made := len(in.Tries)
	if in.KeepAs != "" {
		if err := vmfork.ValidateName(in.KeepAs); err != nil {
			return nil, fmt.Errorf("keep_as: %w", err)
		}
		if s.lim.isSource(in.KeepAs) {
			return nil, limitErr("source", "keep_as %q names one of the operator's sources", in.KeepAs)
		}
		names = append(names, in.KeepAs)
		made++ // the winner's branch and its fork live together a moment
	}
	release, err := s.own.reserve(made, s.lim.MaxMachines, names, "machine", "")
	if err != nil {
		return nil, err
	}
	defer release()
	ctx = forkTrace(ctx, progress(ctx, req), len(in.Tries))
	res, err := s.mg.Explore(ctx, vmfork.ExploreRequest{
		Source: in.Source, Tries: in.Tries, Score: in.Score, KeepAs: in.KeepAs, Watch: in.Watch,
		TryTimeout: time.Duration(in.TimeoutS * float64(time.Second)), TTL: ttl, Prefix: prefix,
		Contract: ct, MaxChildren: s.lim.MaxChildren, TailBytes: s.lim.OutputBytes,
	})
	if res == nil {
		return nil, err
	}
	out := map[string]any{"result": res}
	if err != nil {
		out["error"] = err.Error()
	}
	return out, nil
}

func (s *Server) checkpoint(ctx context.Context, req *mcp.CallToolRequest, in CheckpointIn) (any, error) {
	if err := s.checkOwned(in.Machine); err != nil {
		return nil, err
	}
	name := in.As
	if name == "" {
		for k := 1; ; k++ {
			name = fmt.Sprintf("%s-cp%d", in.Machine, k)
			if _, err := s.mg.Store.FindKept(name); err != nil {
				break
			}
		}
	}
	if err := vmfork.ValidateName(name); err != nil {
		return nil, fmt.Errorf("as: %w", err)
	}
	release, err := s.own.reserve(0, s.lim.MaxMachines, []string{name}, "checkpoint", in.Machine)
	if err != nil {
		return nil, err
	}
	defer release()
	t, err := s.mg.Checkpoint(ctx, vmfork.CheckpointRequest{Machine: in.Machine, As: name})
	if err != nil {
		return nil, err
	}
	return map[string]any{"checkpoint": t.Name, "machine": in.Machine, "created": t.Created}, nil
}

func (s *Server) rewind(ctx context.Context, req *mcp.CallToolRequest, in RewindIn) (any, error) {
	if err := s.checkOwned(in.Machine); err != nil {
		return nil, err
	}
	if !s.own.owns("checkpoint", in.To) {
		return nil, limitErr("owner", "checkpoint %q is not one you made", in.To)
	}
	res, err := s.mg.Rewind(ctx, vmfork.RewindRequest{Machine: in.Machine, To: in.To})
	if err != nil {
		return nil, err
	}
	return map[string]any{"machine": res.Name, "state": res.State, "ready_ms": res.ReadyMS}, nil
}

func (s *Server) rm(ctx context.Context, req *mcp.CallToolRequest, in RmIn) (any, error) {
	if len(in.Names) == 0 {
		return nil, fmt.Errorf("rm: names: give at least one: %w", vmfork.ErrInvalid)
	}
	// Every name first: a call with one name not the agent's removes none.
	kinds := make([]string, len(in.Names))
	for i, name := range in.Names {
		switch {
		case s.own.owns("machine", name):
			kinds[i] = "machine"
		case s.own.owns("checkpoint", name):
			kinds[i] = "checkpoint"
		default:
			return nil, s.notOwned(name)
		}
	}
	var removed []string
	var errs []error
	for i, name := range in.Names {
		var err error
		if kinds[i] == "machine" {
			err = s.mg.Remove(ctx, name, true)
		} else {
			_, err = s.mg.Unkeep(ctx, name)
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		s.own.forget(name)
		removed = append(removed, name)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("rm: removed %v; %w", removed, errors.Join(errs...))
	}
	return map[string]any{"removed": removed}, nil
}

// checkOwned checks that the agent made machine name.
func (s *Server) checkOwned(name string) error {
	if err := vmfork.ValidateName(name); err != nil {
		return err
	}
	if s.own.owns("machine", name) {
		return nil
	}
	return s.notOwned(name)
}

// notOwned is the refusal of a name the agent did not make.
func (s *Server) notOwned(name string) error {
	if s.lim.isSource(name) {
		return limitErr("owner", "%q is a source the operator gave read-only: fork it, read its files, do not change it", name)
	}
	return limitErr("owner", "%q is not a machine or checkpoint you made", name)
}
