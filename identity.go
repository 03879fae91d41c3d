package vmfork

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/vmfork/vmfork/customize"
)

// IdentityOptions say how fork children get identities of their own. The
// zero value is the default: a fresh identity through the default chain.
type IdentityOptions struct {
	// Spec configures the identity chain; customize.LoadSpec reads one
	// from a file. Its zero value is the default chain.
	Spec customize.Spec
	// KeepOnFailure keeps a child whose identity chain failed, with its
	// network link down, instead of killing it.
	KeepOnFailure bool
	// Edit, if set, edits each child's chain after the spec has built it,
	// for steps of the caller's own.
	Edit func(customize.Chain) customize.Chain

	// forkNonce is new for each fork (startChildren): the children's MACs
	// follow from it (prepareIdentity).
	forkNonce string
	// stepEnded, if set, hears how long each step of a child's chain took
	// of its timeout: the fork's pacer (pace.go).
	stepEnded func(took, timeout time.Duration)
}

// Validate checks the options before anything is paused.
func (o IdentityOptions) Validate() error {
	if err := o.Spec.Validate(); err != nil {
		return fmt.Errorf("identity: %w", asInvalid(err))
	}
	return nil
}

// ValidateFor checks the options for a fork of n children.
func (o IdentityOptions) ValidateFor(n int) error {
	if err := o.Spec.ValidateFor(n); err != nil {
		return fmt.Errorf("identity: %w", asInvalid(err))
	}
	return nil
}

// IdentityResult is what the identity chain did in one child: its mode, new
// MAC, hostname, addresses and machine-id, and each step's outcome.
type IdentityResult = customize.Result

// preFork runs the source's pre-fork hooks before it is frozen, then reads
// what its children's chains can know in advance (customize.Facts) into
// tpl. Nothing is paused yet, so a failure here changes nothing.
func (mg *Manager) preFork(ctx context.Context, src *Machine, tpl *Template, opts IdentityOptions) error {
	agent := customize.NewLazyAgent(mg.agentDialer(src))
	defer agent.Close()
	if err := agent.Ping(ctx); errors.Is(err, customize.ErrNoAgent) {
		// Hooks are optional and unknowable without an agent; the
		// children's own chains will report an agent that does not answer.
		mg.Log.WithField("machine", src.Name).WithError(err).Warn("pre-fork hooks not run: the guest agent does not answer")
		return nil
	}
	// The first child's SSH host keys are made from now on, while the hooks
	// run, the source freezes and the child's QEMU starts: an RSA-3072 key
	// took 70-460 ms here (more next to busy TCG guests), and it was the
	// wait that held the child's first batch.
	wantKeys := wantsKeys(opts)
	var early []customize.KeyType
	if wantKeys {
		if early, _ = customize.HostKeyTypes(ctx, agent); len(early) > 0 {
			mg.hostKeys.Prefetch(early, 1)
		}
	}
	env := &customize.Env{Agent: agent, Child: customize.Child{Name: src.Name}}
	res, err := customize.Run(ctx, opts.Spec.PreForkChain(), env)
	mg.logSteps(src, res)
	if errors.Is(err, customize.ErrNoAgent) {
		// Hooks are optional and unknowable without an agent; the
		// children's own chains will report an agent that does not answer.
		mg.Log.WithField("machine", src.Name).WithError(err).Warn("pre-fork hooks not run: the guest agent does not answer")
		return nil
	}
	if err != nil {
		return fmt.Errorf("pre-fork: %w", err)
	}
	// After the hooks, which may change the guest. What cannot be read
	// stays unknown: the children's steps read it themselves.
	facts, ferr := customize.ReadFacts(ctx, agent, macsOf(src))
	if ferr != nil {
		mg.Log.WithField("machine", src.Name).WithError(ferr).Debug("children will read what was not read here")
	}
	tpl.GuestFacts = facts
	if types := keyTypes(tpl); len(types) > 0 && wantKeys {
		if !slices.Equal(early, types) {
			// The hooks changed the keys.
			mg.hostKeys.Prefetch(types, 1)
		}
		tpl.keysStarted = 1
	}
	return nil
}

// wantsKeys reports whether the chain makes SSH host keys.
func wantsKeys(opts IdentityOptions) bool {
	return !slices.Contains(opts.Spec.Skip, customize.StepSSHHostKeys)
}

// keyTypes returns the SSH host key types the facts of tpl list.
func keyTypes(tpl *Template) []customize.KeyType {
	if f := tpl.GuestFacts; f != nil && f.SSH != nil {
		return f.SSH.Types
	}
	return nil
}

// macsOf returns the MACs m's guest may have: its configured one and the
// one its own chain chose.
func macsOf(m *Machine) []string {
	var macs []string
	for _, mac := range []string{m.Spec.MAC, m.GuestMAC} {
		if mac != "" {
			macs = append(macs, mac)
		}
	}
	return macs
}

// prepareIdentity sets what a child's identity needs before its QEMU starts:
// its vmgenid GUID (a new one, or the template's for a reproducible
// identity) and the MAC the guest is to take. The MAC in QEMU's NIC
// configuration stays the template's: the saved device state must match it.
func (mg *Manager) prepareIdentity(c *Machine, tpl *Template, index int, opts IdentityOptions) error {
	if opts.Spec.Mode() == customize.ModeReproducible && tpl.HasMemory {
		if tpl.VMGenID == "" {
			return fmt.Errorf("identity reproducible: template %q recorded no vmgenid", tpl.ID)
		}
		c.VMGenID = tpl.VMGenID
	} else {
		// Chosen here rather than left to guid=auto, so that the identity
		// chain can check it differs from the template's and report it.
		c.VMGenID = newUUID()
	}
	// The MAC follows from the template and the child's index, so siblings
	// never share one, and, for a fresh identity, from its fork's nonce:
	// one child per fork of a kept template is index 1 every time, and
	// such children had one MAC between them, which on a shared bridge is
	// two machines on one MAC and, from a DHCP server that keys leases by
	// MAC (dnsmasq for a client that sends none of its own id), one
	// address. It also steps over the MAC of every machine in the store.
	// A reproducible identity keeps the template's vmgenid, and its MACs.
	seed := fmt.Sprintf("%s\x00%s\x00%s", tpl.ID, tpl.Created.Format(time.RFC3339Nano), tpl.VMGenID)
	if opts.Spec.Mode() != customize.ModeReproducible && opts.forkNonce != "" {
		seed += "\x00" + opts.forkNonce
	}
	c.GuestMAC = customize.ChildMAC([]byte(seed), index, append(mg.inheritedMACs(c, tpl), mg.machineMACs(c.Name)...)...)
	if types := keyTypes(tpl); len(types) > 0 && index > tpl.keysStarted && wantsKeys(opts) {
		mg.hostKeys.Prefetch(types, 1)
	}
	return nil
}

// inheritedMACs are the MACs child c's guest may have at its first instant:
// its template's configured one and the one its source's chain chose
// (recorded in the template; a template made before vmfork recorded it
// falls back to the source's record).
func (mg *Manager) inheritedMACs(c *Machine, tpl *Template) []string {
	macs := []string{tpl.Spec.MAC}
	if tpl.SourceGuestMAC != "" {
		return append(macs, tpl.SourceGuestMAC)
	}
	if src, err := mg.Store.LoadMachine(c.Parent); err == nil && src.GuestMAC != "" {
		macs = append(macs, src.GuestMAC)
	}
	return macs
}

// machineMACs lists the MACs of the store's machines other than name:
// a child's new MAC steps over them. A record that cannot be read is left
// out (the MAC is 24 bits from a hash; a clash with it is unlikely).
func (mg *Manager) machineMACs(name string) []string {
	ms, err := mg.Store.ListMachines()
	if err != nil {
		return nil
	}
	var macs []string
	for _, m := range ms {
		if m.Name == name {
			continue
		}
		for _, mac := range []string{m.GuestMAC, m.Spec.MAC} {
			if mac != "" {
				macs = append(macs, mac)
			}
		}
	}
	return macs
}

// applyIdentity gives running child c its identity and lets it onto the
// network. A live child starts with its NIC link down (the driver sees to
// that); the link goes up only once the chain has finished. A child whose
// chain failed is left with its link down.
func (mg *Manager) applyIdentity(ctx context.Context, c *Machine, tpl *Template, index int, live bool, opts IdentityOptions) (*IdentityResult, error) {
	spec := opts.Spec
	if spec.Network.Mode == "" && len(spec.Network.Addresses) == 0 && len(c.Spec.Ports) > 0 {
		// Port forwards exist only on QEMU's user network, a network of
		// the child's own, and point at the guest's first DHCP address.
		// A renew with the new MAC would get the next one and leave the
		// forwards pointing at nobody, so such a child keeps its address.
		spec.Network.Mode = customize.NetworkNone
	}
	if spec.Network.Mode == "" && len(spec.Network.Addresses) == 0 && c.Spec.Network.Effective().Kind == NetworkNone {
		// A NIC with nothing behind it has no DHCP server to ask.
		spec.Network.Mode = customize.NetworkNone
	}
	chain, err := spec.Chain()
	if err != nil {
		return nil, err
	}
	if !live {
		chain = customize.Booted(chain)
	}
	if chain, err = mg.contractSteps(chain, c, live); err != nil {
		return nil, err
	}
	if opts.Edit != nil {
		chain = opts.Edit(chain)
	}
	agent := customize.NewLazyAgent(mg.agentDialer(c))
	defer agent.Close()
	env := &customize.Env{
		Agent:    agent,
		HostKeys: &mg.hostKeys,
		StepDone: paceSteps(chain, opts.stepEnded, traceOf(ctx).stepDone(c.Name)),
		// On a busy host a late guest is slow, not dead (pace.go).
		Slow: mg.slowGuest(c),
		// A step whose guest still runs may be retried once (an agent
		// that was merely late).
		Runs: mg.guestRuns(c),
		Child: customize.Child{
			Name: c.Name, Parent: c.Parent, Template: tpl.ID, Index: index,
			Mode: spec.Mode(), MAC: c.GuestMAC, OldMACs: mg.inheritedMACs(c, tpl),
			VMGenID: c.VMGenID, TemplateVMGenID: tpl.VMGenID,
			DiskEnv: FreshDiskMarkers(tpl),
		},
	}
	var ls LinkSetter
	if live {
		// The facts hold for a child that goes on from the template's
		// instant, not for one that boots.
		env.Facts = tpl.GuestFacts
		var ok bool
		if ls, ok = mg.Driver.(LinkSetter); !ok {
			return nil, fmt.Errorf("driver %q cannot set a NIC link: %w", mg.Driver.Name(), ErrUnsupported)
		}
		env.Link = customize.LinkFunc(func(ctx context.Context, up bool) error { return ls.SetLink(ctx, c, up) })
	}
	res, err := customize.Run(ctx, chain, env)
	mg.logSteps(c, res)
	c.Identity = res
	if err != nil {
		if ls != nil {
			// The network step raises the link early for DHCP; a child
			// whose identity is incomplete goes back off the network.
			lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			if lerr := ls.SetLink(lctx, c, false); lerr != nil {
				err = fmt.Errorf("%w; and setting the link down failed: %v", err, lerr)
			}
			cancel()
		}
		if serr := mg.Store.SaveMachine(c); serr != nil {
			mg.Log.WithField("machine", c.Name).WithError(serr).Warn("could not record the identity result")
		}
		return res, err
	}
	if err := mg.Store.SaveMachine(c); err != nil {
		return res, err
	}
	if ls != nil {
		if err := ls.SetLink(ctx, c, true); err != nil {
			return res, err
		}
	}
	return res, nil
}

// paceSteps returns done, and before it tells stepEnded (if set) how much of
// its timeout each step of chain that ran used.
func paceSteps(chain customize.Chain, stepEnded func(took, timeout time.Duration), done func(customize.StepResult)) func(customize.StepResult) {
	if stepEnded == nil {
		return done
	}
	timeouts := map[string]time.Duration{}
	for _, s := range chain.Steps() {
		timeouts[s.Name] = s.Timeout
	}
	return func(sr customize.StepResult) {
		if sr.Status == customize.StatusOK || sr.Status == customize.StatusFailed {
			stepEnded(time.Duration(sr.DurationMS*float64(time.Millisecond)), timeouts[sr.Name])
		}
		if done != nil {
			done(sr)
		}
	}
}

// agentDialer connects to m's guest agent under the context of the step
// that first needs it, so the step's timeout bounds the wait.
func (mg *Manager) agentDialer(m *Machine) func(context.Context) (customize.Agent, error) {
	return func(ctx context.Context) (customize.Agent, error) {
		a, err := mg.Driver.Agent(ctx, m)
		if errors.Is(err, ErrNotRunning) {
			// Its QEMU exited: the chain fails now, not at a step's timeout.
			return nil, fmt.Errorf("%w: %w", err, customize.ErrMachineGone)
		}
		if err != nil {
			return nil, err
		}
		return a, nil
	}
}

func (mg *Manager) logSteps(m *Machine, res *IdentityResult) {
	log := mg.Log.WithField("machine", m.Name)
	for _, s := range res.Steps {
		log.WithFields(logrus.Fields{"step": s.Name, "status": s.Status, "elapsed_ms": s.DurationMS, "detail": s.Detail}).Debug("identity step")
	}
}

// newUUID returns a random (version 4) UUID, the form QEMU's vmgenid guid
// takes.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}
