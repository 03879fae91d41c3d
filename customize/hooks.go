package customize

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/vmfork/vmfork/qmp"
)

// The guest's hook directories.
const (
	PostForkDir = "/etc/vmfork/post-fork.d"
	PreForkDir  = "/etc/vmfork/pre-fork.d"
)

// hookName is run-parts' rule: editor backups and package leftovers
// (10-x~, 10-x.dpkg-old) do not run.
var hookName = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// HooksStep runs the guest's post-fork hooks in dir (PostForkDir), in name
// order, with the child's identity in their environment. The first that
// fails stops the rest.
func HooksStep(dir string) Step {
	return Step{Name: StepHooks, Timeout: hooksTimeout, Parts: func(_ context.Context, env *Env) ([]*Part, error) {
		return []*Part{{Script: hooksScript, Args: append([]string{dir}, hookEnv(env)...), Fail: hookFailure}}, nil
	}}
}

// hookFailure is the error of a failed hooksScript.
func hookFailure(code int, out, stderr string) error {
	f := strings.SplitN(strings.TrimSpace(lastLine(out)), " ", 3)
	if code != 102 || len(f) < 2 {
		return &ExitError{What: "hooks", Code: code, Stderr: tail([]byte(stderr))}
	}
	rc, _ := strconv.Atoi(f[1])
	ee := &ExitError{What: fmt.Sprintf("hook %q", f[0]), Code: rc, Stderr: tail([]byte(stderr))}
	if rc > 128 {
		// The shell's way of saying a signal killed it.
		ee.Code, ee.Signal = -1, rc-128
	}
	if len(f) == 3 && f[2] != "" {
		return fmt.Errorf("%w (after %s ran)", ee, f[2])
	}
	return ee
}

// PreForkHooksStep runs the source's pre-fork hooks in dir (PreForkDir),
// to quiesce applications before the freeze. env.Child.Name is the source.
func PreForkHooksStep(dir string) Step {
	return Step{Name: StepPreForkHooks, Timeout: preForkTimeout, Fn: func(ctx context.Context, env *Env) error {
		return runHooks(ctx, env, dir, []string{guestPath, "VMFORK_EVENT=pre-fork", "VMFORK_NAME=" + env.Child.Name})
	}}
}

// hookEnv is the environment of post-fork hooks and extra scripts.
func hookEnv(env *Env) []string {
	c := env.Child
	return append([]string{
		guestPath,
		"VMFORK_EVENT=post-fork",
		"VMFORK_NAME=" + c.Name,
		"VMFORK_PARENT=" + c.Parent,
		"VMFORK_INDEX=" + strconv.Itoa(c.Index),
		"VMFORK_TEMPLATE=" + c.Template,
		"VMFORK_IDENTITY=" + string(c.Mode),
		"VMFORK_HOSTNAME=" + orPlanned(env.Result.Hostname, env.hostname),
		"VMFORK_MAC=" + orPlanned(env.Result.MAC, env.mac),
	}, c.DiskEnv...)
}

func runHooks(ctx context.Context, env *Env, dir string, hookEnv []string) error {
	out, err := shell(ctx, env.Agent, "list hooks in "+dir, listScript, dir)
	if err != nil {
		return err
	}
	var hooks []string
	for _, n := range strings.Split(out, "\n") {
		if hookName.MatchString(n) {
			hooks = append(hooks, n)
		}
	}
	if len(hooks) == 0 {
		return Skipped("no hooks in " + dir)
	}
	sort.Strings(hooks) // byte order, whatever the guest's locale
	for i, h := range hooks {
		st, err := runGuest(ctx, env.Agent, path.Join(dir, h), nil, hookEnv)
		if err == nil {
			err = exitErr(fmt.Sprintf("hook %q", h), st)
		} else {
			err = fmt.Errorf("hook %q: %w", h, err)
		}
		if err != nil {
			if i > 0 {
				return fmt.Errorf("%w (after %s ran)", err, strings.Join(hooks[:i], ", "))
			}
			return err
		}
	}
	env.Detailf("ran %s", strings.Join(hooks, ", "))
	return nil
}

// runGuest runs argv in the guest and waits for it. Its stdout is dropped;
// its stderr is kept for errors.
func runGuest(ctx context.Context, a Agent, file string, args, env []string) (qmp.ExecStatus, error) {
	if env == nil {
		env = []string{guestPath}
	}
	return run(ctx, a, qmp.ExecRequest{Path: file, Args: args, Env: env, CaptureOutput: true})
}

// ScriptStep returns a step called name that copies script (a host file's
// content) into the guest, runs it with args and the hooks' environment,
// and removes it. The script needs a #! line.
func ScriptStep(name string, script []byte, args []string) Step {
	return Step{Name: name, Timeout: scriptTimeout, Fn: func(ctx context.Context, env *Env) error {
		var r [6]byte
		if _, err := rand.Read(r[:]); err != nil {
			return err
		}
		// /tmp, not /run: it is where any Linux guest lets root write. The
		// name is not guessable, so no other guest user can plant it.
		file := "/tmp/.vmfork-" + strings.ReplaceAll(name, "/", "_") + "-" + hex.EncodeToString(r[:])
		if err := env.Agent.WriteFile(ctx, file, script); err != nil {
			return fmt.Errorf("copy script into the guest: %w", err)
		}
		st, err := runGuest(ctx, env.Agent, "/bin/sh", append([]string{"-c", runScript, "sh", file}, args...), hookEnv(env))
		if err != nil {
			return fmt.Errorf("run script: %w", err)
		}
		return exitErr("script", st)
	}}
}

// orPlanned is a fact of the result, or the value a step prepared for it
// earlier in the same batch.
func orPlanned(done, planned string) string {
	if done != "" {
		return done
	}
	return planned
}
