package egress

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"syscall"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"

	"github.com/vmfork/vmfork/contract"
)

// ErrUnavailable is wrapped by every error that says a contract cannot be
// enforced here: nftables, a family or an expression the kernel lacks,
// no cgroup2 mount, no privilege. The Manager refuses such a contract; it
// never runs the machine without it.
var ErrUnavailable = errors.New("egress enforcement unavailable")

// Host is where rules are enforced: a network namespace's nftables. The
// zero Host is the calling process's own namespace, which is where vmfork
// makes taps and where QEMU's user-mode sockets live.
type Host struct {
	// NetNS is a network namespace file (/run/netns/NAME), for tests and
	// for a vmfork that runs its bridge in a namespace of its own; empty
	// is the caller's.
	NetNS string
}

// machinePattern is what Apply takes as a machine: vmfork's names, and a
// caller's qualified ones (a name plus a state dir's id).
var machinePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,99}$`)

func checkMachine(machine string) error {
	if !machinePattern.MatchString(machine) {
		if machine == "" {
			return errors.New("egress: empty machine name")
		}
		return fmt.Errorf("egress: machine %q: want lowercase letters, digits, '.', '_' and '-' (at most 100)", machine)
	}
	return nil
}

// TableName is machine's table, in the bridge family for a tap and in the
// inet family for user-mode networking. The name must be unique among the
// machines whose rules share a network namespace: a caller that runs
// several state dirs side by side qualifies its machine names.
func TableName(machine string) string { return "vmfork-" + machine }

// conn opens nftables in h's namespace; done closes what it opened.
func (h Host) conn() (c *nftables.Conn, done func(), err error) {
	if h.NetNS == "" {
		c, err = nftables.New()
		return c, func() {}, err
	}
	f, err := os.Open(h.NetNS)
	if err != nil {
		return nil, nil, fmt.Errorf("egress: network namespace: %w", err)
	}
	c, err = nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return c, func() { f.Close() }, nil
}

// flush sends c's batch: the kernel applies all of it or none. Its errors
// become one line; the kernel's refusals of something it lacks wrap
// ErrUnavailable.
func flush(c *nftables.Conn, what string) error { return classify(c.Flush(), what) }

func classify(err error, what string) error {
	if err == nil {
		return nil
	}
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return fmt.Errorf("egress: %s: %v", what, oneLine(err))
	}
	switch errno {
	case unix.EPERM:
		return fmt.Errorf("egress: %s: nftables needs CAP_NET_ADMIN (%v): %w", what, errno, ErrUnavailable)
	case unix.EPROTONOSUPPORT, unix.EAFNOSUPPORT, unix.ENOENT, unix.EOPNOTSUPP, unix.EPROTO:
		// What a kernel built without nf_tables, its bridge family, or
		// one of the expressions used (socket, dynset, ct) answers.
		return fmt.Errorf("egress: %s: the kernel's nftables refused it (%v): it lacks nf_tables, its bridge family or an expression these rules use: %w",
			what, errno, ErrUnavailable)
	}
	return fmt.Errorf("egress: %s: %v", what, errno)
}

// oneLine is err's text on one line (errors.Join puts one per line).
func oneLine(err error) string {
	s := []rune(err.Error())
	for i, r := range s {
		if r == '\n' {
			s[i] = ';'
		}
	}
	return string(s)
}

// Remove deletes machine's tables, both families, in one batch. It is
// idempotent: removing what is not there is no error.
func (h Host) Remove(machine string) error {
	if err := checkMachine(machine); err != nil {
		return err
	}
	c, done, err := h.conn()
	if err != nil {
		return err
	}
	defer done()
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyBridge, nftables.TableFamilyINet} {
		// Adding first makes the delete succeed when there is none.
		t := &nftables.Table{Name: TableName(machine), Family: fam}
		c.AddTable(t)
		c.DelTable(t)
	}
	return flush(c, fmt.Sprintf("remove machine %s's tables", machine))
}

// List describes machine's rules as the kernel holds them, one line a
// rule: "bridge vmfork-web from_child: drop everything else (egress:
// none) [12 packets]". No table is no lines and no error.
func (h Host) List(machine string) ([]string, error) {
	if err := checkMachine(machine); err != nil {
		return nil, err
	}
	c, done, err := h.conn()
	if err != nil {
		return nil, err
	}
	defer done()
	var out []string
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyBridge, nftables.TableFamilyINet} {
		t, err := c.ListTableOfFamily(TableName(machine), fam)
		if errors.Is(err, unix.ENOENT) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("egress: list machine %s's %s table: %v", machine, familyName(fam), oneLine(err))
		}
		chains, err := c.ListChainsOfTableFamily(fam)
		if err != nil {
			return nil, fmt.Errorf("egress: list machine %s's chains: %v", machine, oneLine(err))
		}
		for _, ch := range chains {
			if ch.Table.Name != t.Name {
				continue
			}
			rules, err := c.GetRules(t, ch)
			if err != nil {
				return nil, fmt.Errorf("egress: list machine %s's chain %s: %v", machine, ch.Name, oneLine(err))
			}
			for _, r := range rules {
				out = append(out, describe(fam, t.Name, ch.Name, r))
			}
		}
	}
	return out, nil
}

func describe(fam nftables.TableFamily, table, chain string, r *nftables.Rule) string {
	comment, ok := userdata.GetString(r.UserData, userdata.TypeComment)
	if !ok {
		comment = fmt.Sprintf("rule %d (no comment: not made by vmfork)", r.Handle)
	}
	line := fmt.Sprintf("%s %s %s: %s", familyName(fam), table, chain, comment)
	for _, e := range r.Exprs {
		if c, ok := e.(*expr.Counter); ok {
			line += fmt.Sprintf(" [%d packets]", c.Packets)
		}
	}
	return line
}

func familyName(fam nftables.TableFamily) string {
	switch fam {
	case nftables.TableFamilyBridge:
		return "bridge"
	case nftables.TableFamilyINet:
		return "inet"
	}
	return fmt.Sprint(fam)
}

// The expressions below are what nft itself generates for the same
// statements (nft --debug=netlink), so `nft list table` reads them back
// as ordinary rules.

// rules adds rules to one chain, each with a counter and a comment.
type rules struct {
	c     *nftables.Conn
	t     *nftables.Table
	chain *nftables.Chain
}

func (r rules) add(comment string, verdict expr.Any, match ...expr.Any) {
	comment = clip(comment)
	exprs := append(match[:len(match):len(match)], &expr.Counter{}, verdict)
	r.c.AddRule(&nftables.Rule{
		Table: r.t, Chain: r.chain, Exprs: exprs,
		UserData: userdata.AppendString(nil, userdata.TypeComment, comment),
	})
}

// anonSet adds a constant anonymous set of one-byte keys (protocols,
// ICMPv6 types) and returns the lookup of register 1 in it.
func (r rules) anonSet(typ nftables.SetDatatype, keys ...byte) *expr.Lookup {
	s := &nftables.Set{Table: r.t, Anonymous: true, Constant: true, KeyType: typ}
	elems := make([]nftables.SetElement, len(keys))
	for i, k := range keys {
		elems[i] = nftables.SetElement{Key: []byte{k}}
	}
	if err := r.c.AddSet(s, elems); err != nil {
		panic(err) // only for a non-constant anonymous set, which this is not
	}
	return &expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID}
}

// matchIP matches IPv4 (v 4) or IPv6 (v 6) packets: by Ethernet type in
// the bridge family, by netfilter protocol in inet.
func matchIP(fam nftables.TableFamily, v int) []expr.Any {
	if fam == nftables.TableFamilyBridge {
		typ := uint16(unix.ETH_P_IP)
		if v == 6 {
			typ = unix.ETH_P_IPV6
		}
		return etherType(typ)
	}
	p := byte(unix.NFPROTO_IPV4)
	if v == 6 {
		p = unix.NFPROTO_IPV6
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
	}
}

func etherType(typ uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: 12, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(typ)},
	}
}

func version(p netip.Prefix) int {
	if p.Addr().Is4() {
		return 4
	}
	return 6
}

// addrOffset is where the source or destination address lies in the IP
// header, and its length.
func addrOffset(v int, dst bool) (off, n uint32) {
	switch {
	case v == 4 && dst:
		return 16, 4
	case v == 4:
		return 12, 4
	case dst:
		return 24, 16
	}
	return 8, 16
}

// daddr matches the destination address against p; p must be of the
// version matchIP matched. A /0 matches every address of its version.
func daddr(p netip.Prefix) []expr.Any {
	if p.Bits() == 0 {
		return nil
	}
	off, n := addrOffset(version(p), true)
	out := []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n}}
	if p.Bits() < int(n)*8 {
		out = append(out, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: n, Mask: prefixMask(p.Bits(), int(n)), Xor: make([]byte, n)})
	}
	return append(out, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p.Masked().Addr().AsSlice()})
}

func prefixMask(bits, n int) []byte {
	m := make([]byte, n)
	for i := range m {
		switch {
		case bits >= 8:
			m[i] = 0xff
			bits -= 8
		case bits > 0:
			m[i] = byte(0xff << (8 - bits))
			bits = 0
		}
	}
	return m
}

// l4 matches the transport protocol: one, or a set of them.
func (r rules) l4(p Proto) []expr.Any {
	load := &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}
	switch p {
	case TCP:
		return []expr.Any{load, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}}}
	case UDP:
		return []expr.Any{load, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}}}
	}
	return []expr.Any{load, r.anonSet(nftables.TypeInetProto, unix.IPPROTO_TCP, unix.IPPROTO_UDP)}
}

// port matches the TCP or UDP destination (dst) or source port: both
// headers have them at the same offsets, as nft's `th dport`.
func port(dst bool, p uint16) []expr.Any {
	off := uint32(0)
	if dst {
		off = 2
	}
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: off, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(p)},
	}
}

func ifname(key expr.MetaKey, name string) []expr.Any {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b},
	}
}

var (
	accept = &expr.Verdict{Kind: expr.VerdictAccept}
	drop   = &expr.Verdict{Kind: expr.VerdictDrop}
)

func jump(chain string) *expr.Verdict { return &expr.Verdict{Kind: expr.VerdictJump, Chain: chain} }

func cat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// addPolicy adds the rules every enforcement point shares, in Rules'
// order from the DNS rules on: DNS to dns, the allowed tuples around the
// link-local drop, and the mode's default for IP packets.
func (r rules) addPolicy(fam nftables.TableFamily, rs Rules, dns []netip.Addr) {
	for _, a := range dns {
		a = a.Unmap()
		verdict := accept
		if rs.DNS == contract.DNSNone {
			verdict = drop
		}
		p := netip.PrefixFrom(a, a.BitLen())
		r.add(dnsComment(rs.DNS, a), verdict, cat(matchIP(fam, version(p)), daddr(p), r.l4(TCP|UDP), port(true, 53))...)
	}
	tuple := func(t Tuple) {
		e := cat(matchIP(fam, version(t.Prefix)), daddr(t.Prefix), r.l4(t.Protos))
		if t.Port != 0 {
			e = cat(e, port(true, t.Port))
		}
		r.add(allowComment(t), accept, e...)
	}
	for _, t := range rs.Allow {
		if t.LinkLocal() {
			tuple(t)
		}
	}
	for _, ll := range LinkLocal {
		r.add("drop link-local "+ll.String(), drop, cat(matchIP(fam, version(ll)), daddr(ll))...)
	}
	for _, t := range rs.Allow {
		if !t.LinkLocal() {
			tuple(t)
		}
	}
}
