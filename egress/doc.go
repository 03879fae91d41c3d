// Package egress enforces a fork contract's network part on the host,
// where the guest cannot undo it: what a machine may reach (egress all,
// none, or an allow list), what DNS it may use, and that link-local
// addresses (169.254.0.0/16, cloud metadata; fe80::/10) stay out of reach.
//
// # Model
//
// A contract.Network is first compiled (Compile) into Rules: host names
// in the allow list are resolved here, by the host's resolver, never by
// the guest's DNS, and each entry becomes (prefix, port, TCP and UDP)
// tuples. Rules are then enforced at one of three points, by where the
// machine's packets leave:
//
//   - a tap on a bridge (embedded driver, --network bridge=BR): a
//     bridge-family nftables table filters the frames the tap sends into
//     the bridge (Host.ApplyBridge);
//   - QEMU's user-mode network (slirp): the guest's connections leave the
//     host as QEMU's own sockets, so QEMU runs in a cgroup v2 of the
//     machine's (CreateCgroup) and an inet-family table filters the
//     packets of that cgroup's sockets (`socket cgroupv2`, Host.ApplyUser);
//   - a libvirt network: a libvirt nwfilter (NWFilterXML) that the
//     domain's interface references, defined through libvirt.
//
// Every point applies the same order (Rules): what a link needs (ARP,
// DHCP, IPv6 neighbour discovery) and replies on connections made to the
// machine; DNS to the resolver addresses the caller names, accepted or
// dropped by the DNS policy; allowed link-local tuples; the link-local
// drop; the other allowed tuples; the mode's default. Only an allow entry
// inside a link-local prefix lifts the link-local drop: 0.0.0.0/0:80 does
// not reach the metadata service.
//
// Replies: a machine always answers connections made to it (ssh from the
// host, a test server's probe). In inet tables that is `ct state
// established,related accept`, in nwfilter libvirt's state matching; the
// bridge family has no conntrack on many kernels (this project's test
// host's among them), so a bridge table tracks the flows toward the tap
// itself, in timed sets (bridge.go says why not just TCP SYN).
//
// A narrowing change (vmfork contract NAME --set) governs new
// connections: packets of a connection that was already established
// count as replies at every point and go on until it ends.
//
// # Tables
//
// Each machine has one table, vmfork-MACHINE, in the bridge or the inet
// family, in the network namespace of its tap or of QEMU's sockets (Host).
// Apply makes it, or replaces one that exists, in one netlink batch, so a
// machine is never without rules while they change; Remove deletes it and
// is idempotent; List reads it back from the kernel, one line a rule with
// its packet count, for `vmfork contract NAME`. Rules carry comments, so
// `nft list ruleset` explains itself. The package never runs the nft
// command: it speaks netlink through github.com/google/nftables.
//
// A firewall reload that flushes the whole ruleset (`nft flush ruleset`,
// some firewalld reloads) removes these tables with everything else; the
// machine then runs unfiltered until its rules are applied again. That is
// one reason for the second layer below.
//
// # Why user-mode networking is filtered on the host
//
// slirp has its own switch, restrict=on, but it cannot express an allow
// list. Under restrict=on, slirp forwards nothing but its guestfwd rules,
// and a guestfwd can only name an address inside slirp's virtual network
// (libslirp refuses any other), so a destination cannot be let through by
// its real address; restrict=on also drops every UDP datagram but DHCP and
// TFTP, DNS included; and it is fixed when QEMU starts, while a running
// machine's contract can change. A proxy on the host would need the guest
// to use it, and would see only what the guest sends it. Filtering the
// sockets QEMU makes, by their cgroup, sees every connection and datagram
// by its real destination, and changes in place.
//
// restrict=on still serves as a second layer for a machine that may reach
// nothing at all (egress none and DNS none; UserNetdevOptions): it holds
// even if the host's rules are flushed. It cannot be lifted on a running
// machine, so a machine started with it stays closed: the driver should
// refuse a --set that widens it (CheckUserChange) and point to a fork with
// the new contract; a child starts a new slirp.
//
// A socket keeps the cgroup it was made in: QEMU must be in the machine's
// cgroup before the guest's traffic starts, best from birth
// (SysProcAttr.UseCgroupFD). The guest reaches the host's loopback as
// 10.0.2.2, which leaves as a connection to 127.0.0.1: filtered like any
// other destination, so a host service on loopback needs an allow entry
// for 127.0.0.1 and its port.
//
// # What the host must have
//
// nf_tables with the bridge and inet families and the socket (cgroupv2),
// dynset, ct and lookup expressions; cgroup v2 mounted (alone, or beside
// v1 controllers as on this project's test host: Cgroup2Mount finds it
// from /proc/self/mountinfo); CAP_NET_ADMIN. Host.CheckBridge and
// Host.CheckUser ask the kernel without changing anything; their errors,
// and Apply's when the kernel refuses what it lacks, wrap ErrUnavailable,
// and the Manager refuses such a contract before anything is paused: a
// contract that cannot be enforced is never ignored.
//
// On some older kernels, using the v1 net_cls or net_prio controllers
// turns cgroup2 socket matching off for good, and rules that match by
// cgroup then match nothing, silently. The integration test
// (tests/egress_netns_test.go, TestEgressCgroup) shows a process in the
// cgroup blocked and the same process outside it not.
//
// It is a leaf: it imports contract and libraries, nothing else of the
// project.
package egress
