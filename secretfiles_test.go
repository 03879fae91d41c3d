package vmfork

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/vmfork/vmfork/contract"
	"github.com/vmfork/vmfork/customize"
)

// secretFilesSpy is an identity edit that records each chain's step names
// and, in place of the secret-files steps' guest work, what they would
// have given the guest: the wipe's paths and the rotate's input, each
// child's values resolved on the host for real.
type secretFilesSpy struct {
	mu     sync.Mutex
	chains [][]string
	args   map[string][]string // child: the wipe's paths
	input  map[string]string   // child: the rotate's input
}

func (s *secretFilesSpy) edit(c customize.Chain) customize.Chain {
	s.mu.Lock()
	s.chains = append(s.chains, c.Names())
	s.mu.Unlock()
	var out []customize.Step
	for _, st := range c.Steps() {
		if st.Name != customize.StepSecretFilesWipe && st.Name != customize.StepSecretFilesRotate {
			continue
		}
		orig := st
		out = append(out, customize.Step{Name: orig.Name, Timeout: orig.Timeout, Parts: func(ctx context.Context, env *customize.Env) ([]*customize.Part, error) {
			if orig.Parts == nil { // skipped
				return nil, orig.Fn(ctx, env)
			}
			parts, err := orig.Parts(ctx, env)
			if err != nil {
				return nil, err
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.args == nil {
				s.args, s.input = map[string][]string{}, map[string]string{}
			}
			s.args[env.Child.Name] = append(s.args[env.Child.Name], parts[0].Args...)
			s.input[env.Child.Name] += string(parts[0].Input)
			return nil, customize.Skipped("recorded")
		}})
	}
	return customize.NewChain(out...)
}

const rotateContract = `
network: {egress: all, connections: reset}
secret_files:
  wipe: [/etc/app/cache, "/var/lib/my app/session"]
  rotate:
    /etc/app/token: {exec: 'echo "tok-$VMFORK_NAME-$VMFORK_INDEX-$VMFORK_PARENT"'}
    /etc/app/key: {exec: 'printf "key-%s" "$VMFORK_INDEX"'}
`

// Each child's chain has the secret-files steps before its NIC comes up,
// wipe first, after the connections step; each child's values are its own,
// from its name, index and parent, resolved as its identity is applied.
func TestSecretFilesInTheChildsChain(t *testing.T) {
	mg, _ := newHibManager(t)
	ctx := t.Context()
	bootFake(t, mg, "web")
	spy := &secretFilesSpy{}
	res, err := mg.Fork(ctx, ForkRequest{Source: "web", Count: 2, Identity: IdentityOptions{Edit: spy.edit}, Contract: mustContract(t, rotateContract)})
	if err != nil {
		t.Fatal(err)
	}
	if len(spy.chains) != 2 {
		t.Fatalf("%d chains, want one per child", len(spy.chains))
	}
	for _, names := range spy.chains {
		i := slices.Index(names, customize.StepSecretFilesWipe)
		if i < 1 || names[i-1] != customize.StepConnections || names[i+1] != customize.StepSecretFilesRotate || names[i+2] != customize.StepNetwork {
			t.Errorf("chain %v: want connections, wipe, rotate, network in a row", names)
		}
	}
	for i, ch := range res.Children {
		if got := spy.args[ch.Name]; strings.Join(got, "|") != "/etc/app/cache|/var/lib/my app/session" {
			t.Errorf("%s: wipe of %q", ch.Name, got)
		}
		want := fmt.Sprintf("%%vmfork%% F /etc/app/key\nkey-%d%%vmfork%% E\n%%vmfork%% F /etc/app/token\ntok-%s-%d-web\n%%vmfork%% E\n", i+1, ch.Name, i+1)
		if got := spy.input[ch.Name]; got != want {
			t.Errorf("%s: rotate input %q, want %q", ch.Name, got, want)
		}
		var steps []string
		for _, s := range ch.Identity.Steps {
			steps = append(steps, s.Name+":"+string(s.Status))
		}
		if strings.Join(steps, " ") != "vmfork.secret-files.wipe:skipped vmfork.secret-files.rotate:skipped" {
			t.Errorf("%s: identity steps %v", ch.Name, steps)
		}
	}
	// The parent's chain never ran: only its children have the steps.
	if _, ok := spy.input["web"]; ok {
		t.Error("the parent's files were rotated")
	}

	// A child's rewind gives it its identity again, files included.
	child := res.Children[0].Name
	if _, err := mg.Checkpoint(ctx, CheckpointRequest{Machine: child, Identity: quietChain}); err != nil {
		t.Fatal(err)
	}
	delete(spy.input, child)
	if _, err := mg.Rewind(ctx, RewindRequest{Machine: child, To: child + "-cp1", Identity: IdentityOptions{Edit: spy.edit}}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(spy.input[child], "tok-"+child+"-1-web") {
		t.Errorf("rewind: rotate input %q, want the machine's own value again", spy.input[child])
	}

	// A resumed machine keeps its identity: the steps are skipped.
	other := res.Children[1].Name
	if _, err := mg.Hibernate(ctx, other); err != nil {
		t.Fatal(err)
	}
	delete(spy.input, other)
	rr, err := mg.Resume(ctx, ResumeRequest{Machine: other, Identity: IdentityOptions{Edit: spy.edit}})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := spy.input[other]; ok {
		t.Errorf("resume rotated the files: %q", spy.input[other])
	}
	for _, s := range rr.Identity.Steps {
		if s.Status != customize.StatusSkipped || s.Detail != "resume: the machine keeps its identity" {
			t.Errorf("resume: step %+v, want skipped, the machine keeping its identity", s)
		}
	}

	// Children that boot (a stopped source's) get the steps too.
	if _, err := mg.Stop(ctx, "web", false); err != nil {
		t.Fatal(err)
	}
	spy.chains = nil
	if _, err := mg.Fork(ctx, ForkRequest{Source: "web", Count: 1, Identity: IdentityOptions{Edit: spy.edit}, Contract: mustContract(t, rotateContract)}); err != nil {
		t.Fatal(err)
	}
	if len(spy.chains) != 1 || !slices.Contains(spy.chains[0], customize.StepSecretFilesRotate) || slices.Contains(spy.chains[0], customize.StepConnections) {
		t.Errorf("a booted child's chain %v: want the secret-files steps (and no connections to reset)", spy.chains)
	}
}

// A hook that fails fails that child, with one line naming the file and
// its hook, never the hook's command or output.
func TestSecretFilesFailingHook(t *testing.T) {
	mg, _ := newHibManager(t)
	bootFake(t, mg, "web")
	c := mustContract(t, `secret_files: {rotate: {/etc/app/token: {exec: 'echo LEAKED-VALUE; echo no token service >&2; exit 3'}}}`)
	only := func(ch customize.Chain) customize.Chain {
		st, _ := ch.Step(customize.StepSecretFilesRotate)
		return customize.NewChain(st)
	}
	res, err := mg.Fork(t.Context(), ForkRequest{Source: "web", Count: 1, Identity: IdentityOptions{Edit: only}, Contract: c})
	if err == nil || len(res.Failed) != 1 {
		t.Fatalf("fork: %v, %+v; want the child failed", err, res)
	}
	msg := res.Failed[0].Error
	for _, want := range []string{`step "vmfork.secret-files.rotate"`, "secret_files.rotate./etc/app/token.exec", "exit status 3", "no token service"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not say %q", msg, want)
		}
	}
	if strings.Contains(msg, "LEAKED") || strings.Contains(msg, "\n") {
		t.Errorf("error %q: want one line without the hook's output", msg)
	}
	if _, err := mg.Store.LoadMachine(res.Failed[0].Name); err == nil {
		t.Error("the failed child is still there")
	}
}

// The plan refuses what it can see is wrong (a record's contract was never
// parsed), before anything is paused, and says what each child gets.
func TestSecretFilesPlan(t *testing.T) {
	mg, d := newHibManager(t)
	bootFake(t, mg, "web")
	p, err := mg.PlanFork(t.Context(), ForkRequest{Source: "web", Count: 1, Contract: mustContract(t, rotateContract)})
	if err != nil || !strings.Contains(strings.Join(p.Actions, "\n"), "2 file(s) wiped and 2 rotated") {
		t.Errorf("plan %+v, %v: want the secret files described", p, err)
	}
	bad := mustContract(t, `secret_files: {rotate: {/etc/app/token: {exec: x}}}`)
	bad.SecretFiles.Rotate["/etc/app/token"] = contract.Rotate{Exec: " "}
	before := d.freezeSeen
	_, err = mg.Fork(t.Context(), ForkRequest{Source: "web", Count: 1, Contract: bad})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "secret_files.rotate./etc/app/token.exec") || d.freezeSeen != before {
		t.Errorf("an empty hook: %v, want ErrInvalid naming it, before any freeze", err)
	}
}
