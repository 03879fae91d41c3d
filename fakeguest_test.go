package vmfork

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/vmfork/vmfork/customize"
	"github.com/vmfork/vmfork/qmp"
)

// agentDriver is the fake driver with a fake guest agent in each machine, so
// that exec and explore run without a VM. A child's guest starts as a copy
// of its source's files, as a fork's would.
type agentDriver struct {
	*linkDriver
	mu     sync.Mutex
	guests map[string]*fakeGuest
	// frozenAtSwitch: whether the source's filesystems were frozen at
	// each SwitchDisks.
	frozenAtSwitch []bool
}

func newAgentDriver() *agentDriver {
	return &agentDriver{linkDriver: &linkDriver{fakeDriver: newFakeDriver()}, guests: map[string]*fakeGuest{}}
}

// fakeGuestIdentity gives children no identity of their own: the fake
// guest runs only the tiny shell below, not the identity chain's scripts
// nor the source's pre-fork hooks.
var fakeGuestIdentity = IdentityOptions{
	Spec: customize.Spec{Skip: []string{customize.StepPreForkHooks}},
	Edit: func(customize.Chain) customize.Chain { return customize.NewChain() },
}

func (d *agentDriver) guest(name string) *fakeGuest {
	d.mu.Lock()
	defer d.mu.Unlock()
	g, ok := d.guests[name]
	if !ok {
		g = &fakeGuest{files: map[string]string{}, procs: map[int]*qmp.ExecStatus{}}
		d.guests[name] = g
	}
	return g
}

func (d *agentDriver) StartChild(ctx context.Context, c *Machine, t *Template) error {
	if err := d.fakeDriver.StartChild(ctx, c, t); err != nil {
		return err
	}
	src, dst := d.guest(t.Source), d.guest(c.Name)
	src.mu.Lock()
	defer src.mu.Unlock()
	for p, c := range src.files {
		dst.files[p] = c
	}
	return nil
}

func (d *agentDriver) Agent(ctx context.Context, m *Machine) (*qmp.Agent, error) {
	return qmp.NewAgent(d.guest(m.Name)), nil
}

// fakeGuest is a qmp.Transport that plays qemu-ga running /bin/sh -c with
// a tiny shell: commands separated by "; ", each one of "exit N", "echo
// WORD...", "write PATH TEXT" (a file), "cat PATH", "rm PATH", "sleep" (never ends) and
// the snapshot script (md5sum of the files under its arguments).
type fakeGuest struct {
	mu    sync.Mutex
	files map[string]string
	procs map[int]*qmp.ExecStatus
	next  int
	// noFreeze: the agent offers no guest-fsfreeze-*; frozen: its
	// filesystems are frozen now; fsLog: "freeze" and "thaw", in order.
	noFreeze bool
	frozen   bool
	fsLog    []string
}

func (g *fakeGuest) Close() error { return nil }

func (g *fakeGuest) Command(ctx context.Context, req []byte) ([]byte, error) {
	var cmd struct {
		Execute   string          `json:"execute"`
		Arguments json.RawMessage `json:"arguments"`
	}
	if err := json.Unmarshal(req, &cmd); err != nil {
		return nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	var ret any
	switch cmd.Execute {
	case qmp.AgentCmdPing:
		ret = struct{}{}
	case agentCmdInfo:
		type cmd struct {
			Name    string `json:"name"`
			Enabled bool   `json:"enabled"`
		}
		cmds := []cmd{{qmp.AgentCmdPing, true}, {qmp.AgentCmdExec, true}}
		if !g.noFreeze {
			cmds = append(cmds, cmd{agentCmdFreeze, true}, cmd{agentCmdThaw, true})
		}
		ret = map[string]any{"version": "fake", "supported_commands": cmds}
	case agentCmdFreeze, agentCmdThaw:
		if g.noFreeze {
			return []byte(fmt.Sprintf(`{"error": {"class": "CommandNotFound", "desc": "%s"}}`, cmd.Execute)), nil
		}
		g.frozen = cmd.Execute == agentCmdFreeze
		g.fsLog = append(g.fsLog, strings.TrimPrefix(cmd.Execute, "guest-fsfreeze-"))
		ret = 1
	case qmp.AgentCmdExec:
		var a struct {
			Path string   `json:"path"`
			Args []string `json:"arg"`
		}
		if err := json.Unmarshal(cmd.Arguments, &a); err != nil {
			return nil, err
		}
		if a.Path != "/bin/sh" || len(a.Args) < 2 || a.Args[0] != "-c" {
			return []byte(`{"error": {"class": "GenericError", "desc": "fake guest runs only /bin/sh -c"}}`), nil
		}
		g.next++
		g.procs[g.next] = g.run(a.Args[1], a.Args[2:])
		ret = map[string]int{"pid": g.next}
	case qmp.AgentCmdExecStatus:
		var a struct {
			PID int `json:"pid"`
		}
		if err := json.Unmarshal(cmd.Arguments, &a); err != nil {
			return nil, err
		}
		st, ok := g.procs[a.PID]
		if !ok {
			return []byte(`{"error": {"class": "GenericError", "desc": "no such pid"}}`), nil
		}
		ret = st
	default:
		return []byte(fmt.Sprintf(`{"error": {"class": "CommandNotFound", "desc": "%s"}}`, cmd.Execute)), nil
	}
	out, err := json.Marshal(map[string]any{"return": ret})
	return out, err
}

func (g *fakeGuest) run(script string, args []string) *qmp.ExecStatus {
	st := &qmp.ExecStatus{Exited: true}
	if script == snapshotScript {
		var out strings.Builder
		var paths []string
		for p := range g.files {
			paths = append(paths, p)
		}
		sort.Strings(paths)
		for _, p := range paths {
			for _, under := range args {
				if p == under || strings.HasPrefix(p, strings.TrimSuffix(under, "/")+"/") {
					sum := md5.Sum([]byte(g.files[p]))
					fmt.Fprintf(&out, "%s  %s\n", hex.EncodeToString(sum[:]), p)
					break
				}
			}
		}
		st.Stdout = []byte(out.String())
		return st
	}
	var out strings.Builder
	for _, c := range strings.Split(script, "; ") {
		f := strings.Fields(c)
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "exit":
			st.ExitCode, _ = strconv.Atoi(f[1])
			st.Stdout = []byte(out.String())
			return st
		case "echo":
			out.WriteString(strings.Join(f[1:], " ") + "\n")
		case "write":
			g.files[f[1]] = strings.Join(f[2:], " ")
		case "cat":
			c, ok := g.files[f[1]]
			if !ok {
				st.ExitCode, st.Stderr = 1, []byte("cat: "+f[1]+": No such file or directory\n")
				return st
			}
			out.WriteString(c + "\n")
		case "rm":
			delete(g.files, f[1])
		case "sleep":
			return &qmp.ExecStatus{}
		default:
			st.ExitCode = 127
			st.Stderr = []byte("sh: " + f[0] + ": not found\n")
			return st
		}
	}
	st.Stdout = []byte(out.String())
	return st
}
