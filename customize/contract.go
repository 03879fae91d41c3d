package customize

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The guest's part of a child's fork contract (package contract): the
// host enforces the rest (egress, the secrets broker) where the guest
// cannot undo it.

// Names of the contract's steps.
const (
	StepConnections = "vmfork.connections"
	StepSecrets     = "vmfork.secrets"
)

// secretsTimeout bounds the secrets step, whose trust-store update
// (update-ca-certificates) rehashes every certificate: seconds under TCG.
const secretsTimeout = 2 * time.Minute

var (
	connectionsScript = guestScript("connections.sh")
	secretsScript     = guestScript("secrets.sh")
)

// ConnectionsStep closes every TCP connection a child inherited from its
// parent's instant (network.connections: reset), while its link is still
// down, so that its programs get an error at once instead of writing into
// a connection whose peer only knows the parent (scripts/connections.sh).
// It goes before vmfork.network. A guest without ss (iproute2) or whose
// kernel cannot destroy sockets fails it: the contract is not enforced
// there, and the child does not go on as if it were.
func ConnectionsStep() Step {
	return Step{Name: StepConnections, Timeout: DefaultTimeout, Parts: func(context.Context, *Env) ([]*Part, error) {
		return []*Part{{Script: connectionsScript, Done: func(env *Env, out string) error {
			n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(out), " closed"))
			if err != nil {
				return fmt.Errorf("unexpected output %q", out)
			}
			env.Result.ConnectionsClosed = n
			env.Detailf("closed %d inherited TCP connection(s); connections within the guest kept", n)
			return nil
		}, Fail: func(code int, out, stderr string) error {
			if msg := strings.TrimSpace(out); msg != "" {
				return fmt.Errorf("%s (exit %d)", msg, code)
			}
			return fmt.Errorf("exit %d: %s", code, strings.TrimSpace(stderr))
		}}}, nil
	}}
}

// TrustStore is where a guest family keeps the certificates it trusts: an
// os-release ID, the file the CA goes in, the bundle programs read, and
// the command that rebuilds the bundle (package broker, TrustStore).
type TrustStore struct {
	ID     string
	File   string
	Bundle string
	Update []string
}

// SecretsStep writes a child's brokered-secrets files (by absolute path:
// placeholders, proxy settings, vmfork's CA in caFile) and adds the CA to
// the guest's trust store, the first of stores whose ID is the guest's
// os-release ID or ID_LIKE (scripts/secrets.sh). It goes after
// vmfork.network and before vmfork.hooks, whose hooks may use them.
func SecretsStep(files map[string][]byte, caFile string, stores []TrustStore) Step {
	return Step{Name: StepSecrets, Timeout: secretsTimeout, Parts: func(context.Context, *Env) ([]*Part, error) {
		var in strings.Builder
		for _, path := range slices.Sorted(maps.Keys(files)) {
			c := files[path]
			if !strings.HasPrefix(path, "/") || strings.ContainsAny(path, "\n") || strings.Contains(string(c), keyMark) {
				return nil, fmt.Errorf("secrets: file %q cannot be written", path)
			}
			fmt.Fprintf(&in, "%s F %s\n%s%s E\n", keyMark, path, c, keyMark)
		}
		args := []string{caFile}
		for _, ts := range stores {
			if strings.ContainsAny(ts.ID+ts.File+ts.Bundle, " \n") || ts.File == "" || ts.Bundle == "" || len(ts.Update) == 0 {
				return nil, fmt.Errorf("secrets: trust store %q: bad entry", ts.ID)
			}
			args = append(args, ts.ID+" "+ts.File+" "+ts.Bundle+" "+strings.Join(ts.Update, " "))
		}
		return []*Part{{Script: secretsScript, Input: []byte(in.String()), Args: args}}, nil
	}}
}

// InsertBefore returns c with steps inserted before the step called name;
// at the end if it has no such step.
func (c Chain) InsertBefore(name string, steps ...Step) Chain {
	i := c.index(name)
	if i < 0 {
		return c.Append(steps...)
	}
	out := append([]Step(nil), c.steps[:i]...)
	out = append(out, steps...)
	return Chain{steps: append(out, c.steps[i:]...)}
}
