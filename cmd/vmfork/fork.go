package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/vmfork/vmfork"
	"github.com/vmfork/vmfork/customize"
)

var forkCommand = &cli.Command{
	Name:      "fork",
	Usage:     "turn a machine into N+1 machines that continue from the same instant",
	ArgsUsage: "SOURCE [NAME...]",
	Description: `Forks SOURCE into children. A running source is paused for a fraction of a
second while its device state, disk and RAM are frozen into a template; then it
carries on, and each child continues from that instant with every process,
file and open connection of the source. Children share the template's RAM and
disk copy-on-write, so a child costs only what it changes.

A stopped source has only its disk: its children boot fresh from a
copy-on-write view of it. SOURCE may also name a kept template ("vmfork
template save"): its children continue from the instant it was saved, the
source is not touched, and processes of its warm pool are used first.

Children are named NAME... or, with --count, PREFIX-1, PREFIX-2, ... (the next
free numbers; PREFIX defaults to SOURCE). When only some children come up,
those stay, the failures are listed and the exit code is 3.

IDENTITY: before a child goes onto the network it gets an identity of its own,
through the guest agent: clock stepped to host time, kernel RNG reseeded (a
new vmgenid), hostname, machine-id, SSH host keys, a new MAC and then DHCP or
a static address, then the guest's /etc/vmfork/post-fork.d hooks. Its NIC
link is down until then (DHCP raises it once the MAC is new). Before the
freeze, the source's /etc/vmfork/pre-fork.d hooks run. --identity
reproducible keeps the template's vmgenid, clock and RNG state in every child.
A child whose identity fails is killed (or kept, link down, with
--on-identity-failure keep) and counts as failed. --customize FILE reads a
spec (YAML or JSON: identity, hostname, network, skip, timeouts, steps,
on_failure, disks); the flags below override it. Steps: vmfork.agent, vmfork.clock,
vmfork.rng, vmfork.hostname, vmfork.machine-id, vmfork.ssh-host-keys,
vmfork.network, vmfork.hooks, and vmfork.pre-fork-hooks in the source.

   vmfork fork web --count 3
   vmfork fork web try-a try-b --json
   vmfork fork web -n 3 --hostname 'web-{n}' --address 10.0.2.21/24 \
       --address 10.0.2.22/24 --address 10.0.2.23/24 --skip-step vmfork.ssh-host-keys
   vmfork fork web -n 2 --customize identity.yaml --identity reproducible

RAM: a source forked before (or a child) already maps a frozen file; its fork
then makes a delta template: that file plus the pages changed since the last
fork, chained to the deltas before (template ls: KIND delta/N). Nothing is
copied, before or in the pause, but what changed. Each child writes the chain
into its own memory before it runs, and holds those pages alone. The fork
makes one full file instead (copied while the source runs, which then starts
its deltas again) when the children would together hold more than half of it
(--count N times the pages changed since the file was frozen), or with
--no-delta. "vmfork template compact" makes a delta template full later.

DISKS: every disk of a running source is frozen in the same pause. Each
extra disk forks by its policy (boot --disk id=ID,file=PATH,fork=POLICY),
which --disk-policy ID=POLICY overrides for one fork: cow (each child's
own overlay on the frozen disk), shared (one read-only image for all),
fresh or keep (each child gets an empty disk of the same size and
VMFORK_DISK_<ID>=fresh in its post-fork hooks; keep also marks the disk
as the source's alone). The boot disk always forks cow.

   vmfork fork desk -n 3 --disk-policy home=fresh

DISK-ONLY: --disk-only forks a running source's disks alone. Its guest agent
freezes the guest's filesystems (guest-fsfreeze-freeze, bounded) for the
moment every disk switches to a new overlay in one transaction, then thaws
them; the source's vCPUs never stop, and the children boot fresh from that
view with identities of their own. A guest whose agent cannot freeze is
refused before anything changes; --crash-consistent takes its disks
unfrozen, as a power cut would leave them.

   vmfork fork db --disk-only -n 4`,
	Flags: []cli.Flag{
		&cli.IntFlag{Name: "count", Aliases: []string{"n"}, Usage: "number of children (default 1, or the number of NAMEs)"},
		&cli.StringFlag{Name: "prefix", Usage: "name children PREFIX-1, PREFIX-2, ... (default SOURCE)"},
		parallelFlag("children started at once"),
		maxChildrenFlag("refuse a fork of more children than this"),
		&cli.StringFlag{Name: "customize", Usage: "read the identity spec from `FILE` (YAML, or JSON if it ends in .json)"},
		&cli.StringFlag{Name: "identity", Usage: "fresh (new vmgenid, clock and RNG) or reproducible (the template's)", DefaultText: "fresh"},
		&cli.StringFlag{Name: "hostname", Usage: "hostname `PATTERN`: {n} the child's index, {name} its name, {parent} the source's", DefaultText: "{name}"},
		&cli.StringFlag{Name: "network", Usage: "dhcp, static (with --address) or none (only a new MAC)", DefaultText: "dhcp; none for a source with port forwards, whose forwards point at its address"},
		&cli.StringSliceFlag{Name: "address", Usage: "static address `CIDR` for the next child, in order; repeatable"},
		&cli.StringFlag{Name: "gateway", Usage: "default gateway `IP` for static addresses"},
		&cli.StringSliceFlag{Name: "dns", Usage: "name server `IP` for static addresses; repeatable"},
		&cli.StringSliceFlag{Name: "skip-step", Usage: "do not run the identity step `NAME`; repeatable"},
		&cli.StringSliceFlag{Name: "step-timeout", Usage: "bound identity step NAME to a duration, as `NAME=DURATION`; repeatable"},
		&cli.StringSliceFlag{Name: "extra-step", Usage: "copy host script FILE into each child and run it as step NAME (namespaced, e.g. acme.setup) at the end, as `NAME=FILE`; repeatable"},
		&cli.StringSliceFlag{Name: "disk-policy", Usage: "fork disk ID this way in this fork, as `ID=POLICY` (cow, shared, fresh, keep); repeatable"},
		&cli.BoolFlag{Name: "disk-only", Usage: "fork only the disks of a running source: its guest's filesystems are frozen through its agent for the switch, its vCPUs never stop, and the children boot fresh"},
		&cli.BoolFlag{Name: "crash-consistent", Usage: "with --disk-only, where the guest agent cannot freeze filesystems: switch the disks unfrozen (as if the power went)"},
		&cli.BoolFlag{Name: "no-delta", Usage: "make the template's RAM one full file the children share, where a delta would be made (RAM above)"},
		&cli.BoolFlag{Name: "detach-devices", Usage: "when the source's extra devices (boot --device) forbid the fork, unplug them for it and plug them back after; children get none"},
		&cli.StringFlag{Name: "on-identity-failure", Usage: "kill the child, or keep it with its network link down", DefaultText: "kill"},
		ttlFlag,
		contractFlag,
		dryRunFlag,
		jsonFlag,
		traceJSONFlag,
	},
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() < 1 {
			return usageError{errors.New("fork needs a source machine: vmfork fork SOURCE [NAME...]")}
		}
		if cliCtx.IsSet("to") {
			return forkTo(cliCtx)
		}
		for _, f := range []string{"to-mode", "postcopy-bandwidth", "postcopy-after"} {
			if cliCtx.IsSet(f) {
				return usageError{fmt.Errorf("--%s goes with --to (fork onto another host)", f)}
			}
		}
		req, err := forkRequest(cliCtx)
		if err != nil {
			return err
		}
		return run(cliCtx, func(v verb) error {
			return v.planOr(func() (*vmfork.Plan, error) { return v.mg.PlanFork(v.ctx, req) }, func() error {
				res, err := v.mg.Fork(withProgress(v.ctx, cliCtx), req)
				return show(v, res, err, printFork)
			})
		})
	},
}

// forkRequest reads fork's arguments and flags into a request; every bad
// value is a usage error, found before anything is paused.
func forkRequest(cliCtx *cli.Context) (vmfork.ForkRequest, error) {
	if err := checkTTLFlag(cliCtx); err != nil {
		return vmfork.ForkRequest{}, err
	}
	req := vmfork.ForkRequest{
		Source:          cliCtx.Args().First(),
		Names:           cliCtx.Args().Tail(),
		Count:           cliCtx.Int("count"),
		Prefix:          cliCtx.String("prefix"),
		Parallel:        cliCtx.Int("parallel"),
		MaxChildren:     cliCtx.Int("max-children"),
		TTL:             cliCtx.Duration("ttl"),
		DetachDevices:   cliCtx.Bool("detach-devices"),
		NoDelta:         cliCtx.Bool("no-delta"),
		DiskOnly:        cliCtx.Bool("disk-only"),
		CrashConsistent: cliCtx.Bool("crash-consistent"),
	}
	if req.CrashConsistent && !req.DiskOnly {
		return vmfork.ForkRequest{}, usageError{errors.New("--crash-consistent applies to --disk-only")}
	}
	var err error
	if req.DiskPolicies, err = vmfork.ParseDiskPolicies(cliCtx.StringSlice("disk-policy")); err != nil {
		return vmfork.ForkRequest{}, fmt.Errorf("--disk-policy: %w", err)
	}
	if cliCtx.IsSet("count") && req.Count < 1 {
		return vmfork.ForkRequest{}, usageError{fmt.Errorf("--count %d: want at least 1", req.Count)}
	}
	if err := checkForkLimits(cliCtx); err != nil {
		return vmfork.ForkRequest{}, err
	}
	if req.Count == 0 && len(req.Names) == 0 {
		req.Count = 1
	}
	if req.Identity, err = identityOptions(cliCtx); err != nil {
		return vmfork.ForkRequest{}, err
	}
	if req.Contract, err = contractOf(cliCtx, req.Identity.Spec.Contract); err != nil {
		return vmfork.ForkRequest{}, err
	}
	// The spec's disk policies, under the flag's.
	for id, pol := range req.Identity.Spec.Disks {
		if _, set := req.DiskPolicies[id]; set {
			continue
		}
		p, err := vmfork.ParseDiskPolicy(pol)
		if err != nil {
			return vmfork.ForkRequest{}, fmt.Errorf("--customize: disks: %w", err)
		}
		if req.DiskPolicies == nil {
			req.DiskPolicies = map[string]vmfork.DiskPolicy{}
		}
		req.DiskPolicies[id] = p
	}
	return req, nil
}

// parallelFlag and maxChildrenFlag are fork's, and explore's, which forks
// one branch per try: the same flags with the same defaults, each command
// saying what it counts.
func parallelFlag(usage string) cli.Flag {
	return &cli.IntFlag{Name: "parallel", Aliases: []string{"j"}, Usage: usage, Value: 4}
}

func maxChildrenFlag(usage string) cli.Flag {
	return &cli.IntFlag{Name: "max-children", Usage: usage, Value: vmfork.DefaultMaxChildren, EnvVars: []string{"VMFORK_MAX_CHILDREN"}}
}

// checkForkLimits refuses --parallel or --max-children below 1 (the
// library would read 0 as its default, which is not what was asked).
func checkForkLimits(cliCtx *cli.Context) error {
	for _, name := range []string{"parallel", "max-children"} {
		if n := cliCtx.Int(name); n < 1 {
			return usageError{fmt.Errorf("--%s %d: want at least 1", name, n)}
		}
	}
	return nil
}

func printFork(res *vmfork.ForkResult) {
	if res.DiskOnly {
		fmt.Printf("forked %s's disks at template %s (vCPUs never paused; filesystems frozen %.1f ms)\n", res.Source, res.Template, res.FSFrozenMS)
	} else if res.PauseMS > 0 {
		fmt.Printf("forked %s at template %s (source paused %.1f ms)\n", res.Source, res.Template, res.PauseMS)
	} else {
		fmt.Printf("forked %s at template %s (nothing paused)\n", res.Source, res.Template)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CHILD\tSTATE\tPID\tRUNNING\tREADY\tPORTS\tHOSTNAME\tMAC\tADDRESSES")
	for _, c := range res.Children {
		var ports []string
		for _, p := range c.Ports {
			ports = append(ports, p.String())
		}
		host, mac, addrs := "-", "-", "-"
		if id := c.Identity; id != nil {
			host, mac, addrs = orDash(id.Hostname), orDash(id.MAC), orDash(strings.Join(id.Addresses, ","))
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.0f ms\t%.0f ms\t%s\t%s\t%s\t%s\n", c.Name, c.State, c.PID, c.RunningMS, c.ReadyMS,
			orDash(strings.Join(ports, ",")), host, mac, addrs)
	}
	for _, f := range res.Failed {
		fmt.Fprintf(tw, "%s\tfailed\t-\t-\t-\t%s\n", f.Name, f.Error)
	}
	tw.Flush()
}

// identityOptions builds the identity options from --customize and the
// flags that override it. Every bad value is a usage error, found before
// anything is paused.
func identityOptions(cliCtx *cli.Context) (vmfork.IdentityOptions, error) {
	var opts vmfork.IdentityOptions
	spec := &opts.Spec
	if f := cliCtx.String("customize"); f != "" {
		s, err := customize.LoadSpec(f)
		if err != nil {
			return opts, usageError{fmt.Errorf("--customize: %w", err)}
		}
		*spec = s
	}
	if cliCtx.IsSet("identity") {
		m, err := customize.ParseMode(cliCtx.String("identity"))
		if err != nil {
			return opts, usageError{fmt.Errorf("--identity: %w", err)}
		}
		spec.Identity = m
	}
	if cliCtx.IsSet("hostname") {
		spec.Hostname = cliCtx.String("hostname")
	}
	if addrs := cliCtx.StringSlice("address"); len(addrs) > 0 {
		spec.Network.Mode, spec.Network.Addresses = customize.NetworkStatic, addrs
	}
	if cliCtx.IsSet("network") {
		spec.Network.Mode = customize.NetworkMode(cliCtx.String("network"))
	}
	if cliCtx.IsSet("gateway") {
		spec.Network.Gateway = cliCtx.String("gateway")
	}
	if dns := cliCtx.StringSlice("dns"); len(dns) > 0 {
		spec.Network.DNS = dns
	}
	spec.Skip = append(spec.Skip, cliCtx.StringSlice("skip-step")...)
	for _, kv := range cliCtx.StringSlice("step-timeout") {
		name, v, ok := strings.Cut(kv, "=")
		d, err := time.ParseDuration(v)
		if !ok || err != nil || d <= 0 {
			return opts, usageError{fmt.Errorf("--step-timeout %q: want NAME=DURATION, such as vmfork.agent=5s", kv)}
		}
		if spec.Timeouts == nil {
			spec.Timeouts = map[string]customize.Duration{}
		}
		spec.Timeouts[name] = customize.Duration(d)
	}
	for _, kv := range cliCtx.StringSlice("extra-step") {
		name, file, ok := strings.Cut(kv, "=")
		if !ok || file == "" {
			return opts, usageError{fmt.Errorf("--extra-step %q: want NAME=FILE, such as acme.setup=./setup.sh", kv)}
		}
		abs, err := filepath.Abs(file)
		if err != nil {
			return opts, usageError{fmt.Errorf("--extra-step %q: %w", kv, err)}
		}
		spec.Steps = append(spec.Steps, customize.ScriptSpec{Name: name, Script: abs})
	}
	opts.KeepOnFailure = spec.KeepOnFailure()
	if cliCtx.IsSet("on-identity-failure") {
		switch v := cliCtx.String("on-identity-failure"); v {
		case "kill", "keep":
			opts.KeepOnFailure = v == "keep"
		default:
			return opts, usageError{fmt.Errorf("--on-identity-failure %q: want kill or keep", v)}
		}
	}
	if err := opts.Validate(); err != nil {
		return opts, usageError{err}
	}
	return opts, nil
}
