package egress

import (
	"bufio"
	"fmt"
	"net/netip"
	"os"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"

	"github.com/vmfork/vmfork/contract"
)

// User is a machine on QEMU's user-mode network (slirp): what the guest
// sends leaves the host as QEMU's own sockets.
type User struct {
	// Cgroup holds the machine's QEMU (CreateCgroup).
	Cgroup *Cgroup
	// Resolvers is where slirp forwards the guest's DNS (10.0.2.3): the
	// host's resolvers, ResolvConf("/etc/resolv.conf"). DNS to them on
	// port 53 is accepted under DNS host and dropped under DNS none.
	Resolvers []netip.Addr
}

// ApplyUser enforces r on the sockets of u.Cgroup's processes: an inet
// table of machine's own, made (or replaced) in one netlink batch, whose
// output chain sends every packet of such a socket through r, after
// `ct state established,related accept` (replies on connections made to
// the guest through hostfwd, and later packets of allowed ones). Loopback
// is not special: the guest reaches the host's 127.0.0.1 as 10.0.2.2, so
// a host service on loopback is reachable only if r allows 127.0.0.1 (or
// ::1) and its port. Errors name the machine or the cgroup; one that says
// the kernel cannot do it wraps ErrUnavailable.
func (h Host) ApplyUser(machine string, u User, r Rules) error {
	if err := checkMachine(machine); err != nil {
		return err
	}
	if err := checkRules(r); err != nil {
		return err
	}
	if err := u.Cgroup.check(); err != nil {
		return fmt.Errorf("egress: machine %s: %w", machine, err)
	}
	c, done, err := h.conn()
	if err != nil {
		return err
	}
	defer done()
	t := &nftables.Table{Name: TableName(machine), Family: nftables.TableFamilyINet}
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	buildUser(c, t, u, r)
	return flush(c, fmt.Sprintf("apply machine %s's rules to cgroup %s", machine, u.Cgroup.Rel))
}

// CheckUser reports whether this host can enforce a contract on user-mode
// networking: a cgroup2 mount, and nftables that takes the rules (a batch
// that makes a table like ApplyUser's, for the root cgroup, and deletes
// it again). Call it before anything is paused.
func (h Host) CheckUser() error {
	root, err := Cgroup2Mount()
	if err != nil {
		return err
	}
	cg := &Cgroup{Path: root, Rel: "/", Level: 0}
	if cg.ID, err = cg.inode(); err != nil {
		return fmt.Errorf("egress: cgroup2 root %s: %v: %w", root, err, ErrUnavailable)
	}
	c, done, err := h.conn()
	if err != nil {
		return err
	}
	defer done()
	t := &nftables.Table{Name: fmt.Sprintf("vmfork-probe-%d", os.Getpid()), Family: nftables.TableFamilyINet}
	c.AddTable(t)
	buildUser(c, t, User{Cgroup: cg, Resolvers: []netip.Addr{netip.IPv6Loopback()}}, probeRules)
	c.DelTable(t)
	return flush(c, "probe socket cgroupv2 filtering")
}

func buildUser(c *nftables.Conn, t *nftables.Table, u User, r Rules) {
	policy := nftables.ChainPolicyAccept
	out := c.AddChain(&nftables.Chain{
		Name: "output", Table: t, Type: nftables.ChainTypeFilter, Policy: &policy,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter,
	})
	egress := c.AddChain(&nftables.Chain{Name: "egress", Table: t})
	// socket cgroupv2 level L: the id of the socket's cgroup's ancestor
	// at level L (the cgroup itself when it is at L), a 64-bit id in host
	// order, as nft compares it.
	rules{c, t, out}.add("sockets of cgroup "+u.Cgroup.Rel+": egress", jump(egress.Name),
		&expr.Socket{Key: expr.SocketKeyCgroupv2, Level: u.Cgroup.Level, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint64(u.Cgroup.ID)})
	e := rules{c, t, egress}
	e.add("accept established and related", accept,
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)})
	e.addPolicy(nftables.TableFamilyINet, r, u.Resolvers)
	if r.Mode == contract.EgressAll {
		e.add(defaultComment(r.Mode), accept)
		return
	}
	e.add(defaultComment(r.Mode), drop)
}

// ResolvConf returns the name servers a resolv.conf lists, which is where
// slirp sends the guest's DNS. A file that lists none means 127.0.0.1
// and ::1, as for glibc and libslirp. A missing file is an error.
func ResolvConf(path string) ([]netip.Addr, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("egress: host resolvers: %w", err)
	}
	defer f.Close()
	var out []netip.Addr
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 || f[0] != "nameserver" {
			continue
		}
		a, err := netip.ParseAddr(f[1])
		if err != nil {
			continue // as the resolver does
		}
		out = append(out, a.WithZone("").Unmap())
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("egress: host resolvers: %s: %w", path, err)
	}
	if len(out) == 0 {
		out = []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.IPv6Loopback()}
	}
	return out, nil
}
