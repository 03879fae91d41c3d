package customize

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Names of vmfork's own steps.
const (
	StepAgent        = "vmfork.agent"
	StepClock        = "vmfork.clock"
	StepRNG          = "vmfork.rng"
	StepHostname     = "vmfork.hostname"
	StepMachineID    = "vmfork.machine-id"
	StepSSHHostKeys  = "vmfork.ssh-host-keys"
	StepNetwork      = "vmfork.network"
	StepHooks        = "vmfork.hooks"
	StepPreForkHooks = "vmfork.pre-fork-hooks"
)

// Default step timeouts. Generous: they bound a guest that hangs, and TCG
// guests are slow. ssh-keygen makes an RSA key, which takes seconds under
// TCG.
const (
	DefaultTimeout    = 10 * time.Second
	sshTimeout        = 2 * time.Minute
	networkTimeout    = 30 * time.Second
	hooksTimeout      = time.Minute
	preForkTimeout    = 30 * time.Second
	scriptTimeout     = time.Minute
	maxClockOffset    = time.Second
	reseedConfirmWait = "30" // tenths of a second the rng step waits for the kernel's log line
)

// AgentStep waits until the guest agent answers. The agent of a fork child
// answers at once (its connection state is in the migrated device state);
// a guest whose agent died answers never, and this step's timeout says how
// long that takes to find out.
func AgentStep() Step {
	return Step{Name: StepAgent, Timeout: DefaultTimeout, Fn: func(ctx context.Context, env *Env) error {
		return waitAgent(ctx, env.Agent)
	}}
}

// RNGStep confirms that the guest kernel reseeded its CRNG from the child's
// new vmgenid. The GUID is the child's own (QEMU gives it to the guest on
// resume); Linux 5.18+ reseeds when it changes and logs "crng reseeded due
// to virtual machine fork". A kernel without the vmgenid driver keeps its
// siblings' random state, so the step fails there.
func RNGStep() Step {
	return Step{Name: StepRNG, Timeout: DefaultTimeout, Parts: partsRNG}
}

// rngScript prints "reseeded" or "uninitialized" (the CRNG was not yet
// seeded at the fork; it will be seeded from the input pool, which the new
// GUID went into). A grandchild also sees its parent's log line, which is
// fine: its kernel has the driver and its GUID changed. It runs inline (no
// subshell, see batch.go): it returns, and its variables are local. dmesg
// is its one process: no shell builtin reads the kernel log.
const rngScript = `local i=0 log=
set -- $R/sys/bus/acpi/drivers/vmgenid/*:*
if [ ! -e "$1" ]; then
	echo "the guest kernel has no vmgenid driver (CONFIG_VMGENID): the child would keep its siblings' random state; boot a kernel with CONFIG_VMGENID=y (Debian's generic one has it), or --skip-step vmfork.rng" >&2
	return 101
fi
while :; do
	if ! log=$(dmesg 2>&1); then
		echo "cannot read the kernel log to confirm the CRNG reseed: $log" >&2
		return 1
	fi
	case $log in
	*"crng reseeded due to virtual machine fork"*) echo reseeded; return 0 ;;
	*"crng init done"*) ;;
	*) echo uninitialized; return 0 ;;
	esac
	i=$((i + 1))
	if [ "$i" -ge ` + reseedConfirmWait + ` ]; then
		echo "the kernel log shows no CRNG reseed after the vmgenid change" >&2
		return 101
	fi
	sleep 0.1
done`

func partsRNG(_ context.Context, env *Env) ([]*Part, error) {
	c := env.Child
	if c.VMGenID == "" {
		return nil, fmt.Errorf("the child has no vmgenid of its own")
	}
	if strings.EqualFold(c.VMGenID, c.TemplateVMGenID) {
		return nil, fmt.Errorf("the child has its template's vmgenid %s, so its kernel would not reseed", c.VMGenID)
	}
	return []*Part{{Script: rngScript, Inline: true, Done: func(env *Env, out string) error {
		switch strings.TrimSpace(out) {
		case "reseeded":
			env.Detailf("kernel CRNG reseeded from vmgenid %s", c.VMGenID)
		case "uninitialized":
			env.Detailf("kernel CRNG not seeded yet; vmgenid %s is in the pool it will be seeded from", c.VMGenID)
		default:
			return fmt.Errorf("confirm reseed: unexpected output %q", out)
		}
		return nil
	}}}, nil
}

// keepRNGStep replaces RNGStep for a reproducible identity: it checks that
// the child kept its template's vmgenid, so the kernel did not reseed.
func keepRNGStep() Step {
	return Step{Name: StepRNG, Fn: func(_ context.Context, env *Env) error {
		c := env.Child
		if !strings.EqualFold(c.VMGenID, c.TemplateVMGenID) {
			return fmt.Errorf("a reproducible identity needs the template's vmgenid %q; the child has %q", c.TemplateVMGenID, c.VMGenID)
		}
		return Skipped("identity reproducible: the child kept its template's vmgenid, so its kernel CRNG goes on from the template's state")
	}}
}

// Reproducible rewrites c for --identity reproducible: the clock and the
// random state stay the template's. Network identity still changes.
func Reproducible(c Chain) Chain {
	c = c.Skip("identity reproducible: the clock goes on from the template's", StepClock)
	if c.Has(StepRNG) {
		c = c.Swap(keepRNGStep())
	}
	return c
}

// Booted rewrites c for a child that booted fresh from a stopped source's
// disk: its kernel seeded its own random state at boot.
func Booted(c Chain) Chain {
	return c.Skip("booted fresh: the kernel seeded its random state at boot", StepRNG)
}

// HostnameStep sets the guest's hostname from pattern (see ExpandHostname).
// With systemd-hostnamed on a bus that answers it uses hostnamectl; else
// (no D-Bus, as on minimal servers) it writes /etc/hostname and the
// kernel's name itself. Either way it renames the old name in /etc/hosts.
// Its detail names the mechanism.
func HostnameStep(pattern string) Step {
	return Step{Name: StepHostname, Timeout: DefaultTimeout, Parts: func(_ context.Context, env *Env) ([]*Part, error) {
		h, err := ExpandHostname(pattern, env.Child)
		if err != nil {
			return nil, err
		}
		env.hostname = h
		return []*Part{{Script: hostnameScript, Inline: true, Args: []string{h}, Done: func(env *Env, out string) error {
			env.Result.Hostname = h
			env.Detailf("%s (%s)", h, strings.TrimSpace(out))
			return nil
		}}}, nil
	}}
}

// hostnameScript sets $1 as the hostname and prints the mechanism. Every
// process it starts costs tens of milliseconds in a fork child under TCG,
// so it starts none where a shell builtin does: the kernel's hostname is
// read and written through /proc (what hostname(1) does with
// sethostname(2)), and /etc/hosts is rewritten by replaceHostFunc, and only
// when it names the old hostname. hostnamectl talks to systemd-hostnamed
// over D-Bus and fails without a bus ("Failed to connect to bus"), so it is
// tried only when the system bus's socket is there, and its failure falls
// back to the files. Files are rewritten in place (>), never replaced:
// qemu-ga runs commands with umask 077, and a new /etc/hosts would be
// unreadable to everyone but root. It runs inline (no subshell, see
// batch.go): every command that may fail returns its status.
const hostnameScript = replaceHostFunc + `local new=$1 old= cur= how= err= uts=$R/proc/sys/kernel/hostname
if [ -r "$uts" ]; then read -r old <"$uts" || :; else old=$(hostname 2>/dev/null || true); fi
if [ -d $R/run/systemd/system ] && [ -S $R/run/dbus/system_bus_socket ] && command -v hostnamectl >/dev/null 2>&1; then
	if err=$(hostnamectl set-hostname "$new" 2>&1); then
		how=hostnamectl
	else
		how="hostnamectl failed (${err%%
*}), so $R/etc/hostname and the kernel's name"
	fi
fi
if [ "$how" != hostnamectl ]; then
	{ printf '%s' "$new" >"$uts" && read -r cur <"$uts"; } 2>/dev/null || true
	# The kernel cuts a long name short where sethostname fails: let
	# hostname(1) set it, or say why it cannot.
	if [ "$cur" != "$new" ]; then
		if ! command -v hostname >/dev/null 2>&1; then
			echo "cannot set the kernel's hostname: $R/proc/sys/kernel/hostname did not take it and the guest has no hostname command (install hostname, or --skip-step vmfork.hostname)" >&2
			return 101
		fi
		hostname "$new" || return
	fi
	if [ -e $R/etc/hostname ]; then printf '%s\n' "$new" >$R/etc/hostname || return; fi
	: "${how:=$R/etc/hostname and the kernel's name}"
fi
if [ -n "$old" ] && [ "$old" != "$new" ] && [ -f $R/etc/hosts ]; then
	replace_host $R/etc/hosts "$old" "$new" || return
	how="$how, $R/etc/hosts"
fi
printf '%s\n' "$how"`

// replaceHostFunc defines replace_host FILE OLD NEW, which replaces OLD by
// NEW wherever it is a host name in FILE (a field after the first), like
//
//	awk -v old="$old" -v new="$new" '{ for (i = 2; i <= NF; i++) if ($i == old) $i = new; print }'
//
// with shell builtins only: lines it changes have their fields joined by
// single spaces, other lines stay as they are, and FILE is written only if
// a line changed. A file of more than hostsMaxLines lines, too slow for a
// shell loop, goes through that awk program instead. It returns the status
// of what failed, and its variables are local: the hostname part runs inline.
const replaceHostFunc = `replace_host() {
	local _f=$1 _old=$2 _new=$3 _out= _hit= _n=0 _l= _r= _m= _w= _rc=0
	while IFS= read -r _l || [ -n "$_l" ]; do
		_n=$((_n + 1))
		if [ "$_n" -gt ` + hostsMaxLines + ` ]; then
			awk -v old="$_old" -v new="$_new" '{ for (i = 2; i <= NF; i++) if ($i == old) $i = new; print }' "$_f" >"$_f.vmfork" &&
				cat "$_f.vmfork" >"$_f" || _rc=$?
			rm -f "$_f.vmfork"
			return "$_rc"
		fi
		set -f
		# shellcheck disable=SC2086 # split into fields, as awk does
		set -- $_l
		set +f
		if [ $# -ge 2 ]; then
			_r=$1 _m=
			shift
			for _w in "$@"; do
				if [ "$_w" = "$_old" ]; then _w=$_new _m=1; fi
				_r="$_r $_w"
			done
			if [ -n "$_m" ]; then _l=$_r _hit=1; fi
		fi
		_out="$_out$_l
"
	done <"$_f"
	if [ -n "$_hit" ]; then printf '%s' "$_out" >"$_f"; fi
}
`

// hostsMaxLines is the longest /etc/hosts that replace_host edits itself.
const hostsMaxLines = "500"

// Hostname placeholders.
var hostnameVars = map[string]func(Child) string{
	"n":      func(c Child) string { return strconv.Itoa(c.Index) },
	"name":   func(c Child) string { return c.Name },
	"parent": func(c Child) string { return c.Parent },
}

// ExpandHostname fills in pattern for child c: {n} is its index in the fork
// (1, 2, ...), {name} its machine name, {parent} its source's. The result
// must be a valid hostname.
func ExpandHostname(pattern string, c Child) (string, error) {
	var b strings.Builder
	rest := pattern
	for {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			b.WriteString(rest)
			break
		}
		b.WriteString(rest[:i])
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			return "", fmt.Errorf("hostname pattern %q: unclosed {", pattern)
		}
		name := rest[i+1 : i+j]
		f, ok := hostnameVars[name]
		if !ok {
			return "", fmt.Errorf("hostname pattern %q: unknown placeholder {%s} (want {n}, {name} or {parent})", pattern, name)
		}
		b.WriteString(f(c))
		rest = rest[i+j+1:]
	}
	h := b.String()
	if err := checkHostname(h); err != nil {
		return "", fmt.Errorf("hostname pattern %q: %w", pattern, err)
	}
	return h, nil
}

// checkHostname accepts RFC 1123 host names: dot-separated labels of
// letters, digits and inner hyphens, 63 bytes each, 253 in all.
func checkHostname(h string) error {
	if h == "" || len(h) > 253 {
		return fmt.Errorf("hostname %q must have 1 to 253 characters", h)
	}
	for _, l := range strings.Split(h, ".") {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("hostname %q: label %q must have 1 to 63 characters and not start or end with '-'", h, l)
		}
		for _, r := range l {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
				return fmt.Errorf("hostname %q: %q is not allowed (letters, digits, '-' and '.' only)", h, r)
			}
		}
	}
	return nil
}

// MachineIDStep writes a new random /etc/machine-id (and the D-Bus copy
// where it is a file of its own, not the usual link) and restarts
// systemd-journald, which otherwise goes on writing to the journal of the
// old id. Guests without /etc/machine-id are skipped. systemd-networkd
// derives its DHCP client identifier from the machine-id when it starts, so
// this step comes before vmfork.network, which restarts it.
func MachineIDStep() Step {
	return Step{Name: StepMachineID, Timeout: DefaultTimeout, Parts: func(context.Context, *Env) ([]*Part, error) {
		var b [16]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, err
		}
		id := hex.EncodeToString(b[:])
		var detail string
		return []*Part{{Script: machineIDScript, Inline: true, Args: []string{id}, Done: func(env *Env, out string) error {
			env.Result.MachineID = id
			detail = fmt.Sprintf("%s (%s)", id, strings.TrimSpace(out))
			env.Detailf("%s", detail)
			return nil
		}}, {Script: journaldScript, Inline: true, Last: true, Done: func(env *Env, out string) error {
			if out = strings.TrimSpace(out); out != "" {
				detail = strings.TrimSuffix(detail, ")") + "; " + out + ")"
			}
			env.Detailf("%s", detail)
			return nil
		}}}, nil
	}}
}

// machineIDScript writes the new machine-id. It runs inline (no subshell,
// see batch.go).
const machineIDScript = `if [ ! -e $R/etc/machine-id ]; then echo "the guest has no $R/etc/machine-id"; return 100; fi
printf '%s\n' "$1" >$R/etc/machine-id || return 1
local how=$R/etc/machine-id
if [ -f $R/var/lib/dbus/machine-id ] && [ ! -L $R/var/lib/dbus/machine-id ]; then
	printf '%s\n' "$1" >$R/var/lib/dbus/machine-id && how="$how, $R/var/lib/dbus/machine-id (a copy)"
fi
printf '%s\n' "$how"`

// journaldScript restarts journald, which reads the machine-id when it
// starts, as the chain's last part (Part.Last). systemctl reaches PID 1 over
// its private socket, so it works without D-Bus; --no-block and the
// background keep journald's start out of the chain (PID 1 of a fresh child
// under TCG can take seconds to take the job), and nothing in the chain
// needs journald. Inline.
const journaldScript = `if [ -d $R/run/systemd/system ] && [ -e $R/run/systemd/journal/socket ]; then
	systemctl --no-block restart systemd-journald.service >/dev/null 2>&1 </dev/null &
	echo "systemd-journald restarting"
fi
return 0`
