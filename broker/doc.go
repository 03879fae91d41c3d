// Package broker gives machines secrets they never hold: the brokered
// secrets of the fork contract (contract.Secret). The guest holds a
// placeholder; a proxy on the host, one per machine, puts that machine's
// own value in place of the placeholder in its requests to the hosts the
// secret is bound to, and only there. Code, environment, files, RAM,
// templates and snapshots of the guest never contain the value.
//
// It is a leaf: it imports the contract package and libraries, nothing
// else of vmfork. The proxy is github.com/elazarl/goproxy.
//
// # Terms
//
//   - value: what a secret is for one machine (Resolve): the output of an
//     exec hook run on the host with the machine's name, parent and index
//     in VMFORK_NAME, VMFORK_PARENT and VMFORK_INDEX (so each child of a
//     fork can get a credential of its own), an environment variable of
//     the command that makes the machine, or a host file.
//   - placeholder: what the guest holds instead, one per machine and
//     secret (NewPlaceholder): vmfork-secret-NAME-<16 random hex digits>.
//     It names the secret, occurs nowhere by accident, and tells nothing of
//     the value. It is no secret: knowing another machine's placeholder
//     gets nothing (below).
//   - proxy: a machine's HTTP proxy (Proxy), which its guest uses through
//     HTTPS_PROXY and HTTP_PROXY.
//   - broker: the process that holds every registered machine's proxy and
//     values (Server; the vmfork broker command).
//
// # In the guest
//
// GuestFiles makes what a machine's guest gets (none of it holds a value,
// so 0644 will do):
//
//   - /etc/vmfork/secrets.env: NAME=placeholder for each secret, then
//     HTTPS_PROXY, HTTP_PROXY (both also in lower case: curl reads only
//     http_proxy), NO_PROXY (localhost, 127.0.0.1, ::1 and the caller's)
//     and NODE_EXTRA_CA_CERTS. It suits sh (set -a; . FILE; set +a) and
//     systemd's EnvironmentFile=.
//   - /etc/vmfork/secrets/NAME: the placeholder alone, no newline, for
//     programs that read a token from a file.
//   - /etc/vmfork/ca.pem: vmfork's CA certificate, which also goes into
//     the guest's trust store (TrustStoreOf):
//     Debian and Ubuntu: /usr/local/share/ca-certificates/vmfork.crt, then
//     update-ca-certificates (the file must end in .crt); Alpine: the same
//     with apk's ca-certificates package; Fedora, RHEL and kin:
//     /etc/pki/ca-trust/source/anchors/vmfork.pem, then update-ca-trust
//     extract; openSUSE: /etc/pki/trust/anchors/, then
//     update-ca-certificates; Arch: /etc/ca-certificates/trust-source/anchors/,
//     then update-ca-trust. Programs with a CA list of their own need it
//     too: Node.js reads NODE_EXTRA_CA_CERTS (set above), Python's requests
//     uses certifi unless REQUESTS_CA_BUNDLE names the system bundle, Java
//     needs keytool -importcert into its cacerts. A guest of a family not
//     listed gets the files and must be given the CA by hand.
//
// A program uses a secret as it would the value: it reads $NAME (or the
// file) and sends it, formatted as the API wants ("Authorization: Bearer
// $TOKEN"), through the proxy.
//
// # The proxy
//
// Each machine's proxy serves on a listener of its own, and everything
// that connects there is that machine: the broker knows who asks from
// where the connection arrives, never from anything the guest says. The
// listener is a unix socket QEMU's guestfwd connects to (per machine by
// construction), or a TCP port with Child.AllowFrom naming the machine's
// own addresses (a port every guest can reach would let one machine use
// another's values).
//
//   - A CONNECT to a host one of the machine's secrets is bound to (the
//     contract's exact names, case-insensitive) is terminated by the
//     broker: TLS with a certificate for that host signed by vmfork's CA
//     (LoadOrCreateCA), then each request in it goes to that host, and
//     only to it (a request naming another host in the same connection is
//     answered 421), over a new TLS connection that verifies the server's
//     real certificate against the host's trust store (plus
//     Options.ExtraRoots).
//   - In every request to a bound host, if the secret's header (default
//     Authorization) holds the machine's placeholder, the header becomes
//     the secret's format (default "{value}") with the value. Nowhere else:
//     not the URL, not the body, not other headers, not another host. A
//     header without the placeholder, or no header, is sent unchanged, and
//     TRACE to a bound host (which would echo the header back) is refused.
//   - A CONNECT to any other host is a plain tunnel: the broker never
//     decrypts it, and what the guest sent (placeholder and all) is what
//     the server gets.
//   - Plain HTTP requests are treated the same by host: substituted for a
//     bound host (the value then crosses the network in clear, as the
//     guest asked), forwarded as they are otherwise.
//   - Every connection the proxy opens is checked against the machine's
//     egress (Child.Egress): names resolved on the host, each address
//     checked, only an allowed one dialed. The proxy never widens what the
//     machine may reach: the host's loopback, link-local addresses (cloud
//     metadata) and the like pass only when an allow entry names them.
//   - Limits (Limits): open connections per machine (one past the cap is
//     answered 503), request header size (431), header and handshake
//     timeouts, and an idle timeout that closes any connection, tunnels
//     included, with no traffic for 10 minutes.
//
// A value exists only in the broker's memory and in the requests it
// sends; it is never logged (a secret is logged by name) and never
// written: the broker's registry file holds machines without values.
//
// # Trust
//
// The guest trusts vmfork's CA, for every name: a certificate it signs is
// as good to the guest as a public CA's. Its key (ca-key.pem, 0600, in the
// broker's directory; a key others can read is refused) never leaves the
// host, and only the broker reads it. Whoever holds it can read the
// guest's TLS traffic through the proxy; that is the host's root, who can
// read the guest's memory anyway, so trusting the CA adds no one the guest
// did not already trust. The CA is made once per state directory, valid
// ten years, and can sign host certificates only (path length 0).
//
// A compromised guest can: send requests with its own placeholder to the
// bound hosts, which get its own value (what the secret is for: the
// contract grants it use, not possession); read the responses, so a server
// that echoes the header gives the value away; make requests to any host
// its egress allows. It cannot: get a value out of the broker otherwise
// (the value goes only into the bound hosts' header, over TLS that
// verifies the real server, so pointing a bound name at its own server
// fails); use another machine's value (its connections are its own, and
// another's placeholder is just a string to its proxy); use the proxy to
// reach what its egress forbids or the host's own services; hold the
// broker's memory (connection, header and time limits); see a value in
// its RAM, disk or a snapshot of either. The broker's own process is
// hardened (Harden: no core dumps, not dumpable, so other processes of
// its user cannot ptrace it or read its memory); root on the host can.
//
// # The broker's life
//
// The proxies must answer while no vmfork command runs, so they live in
// a process of their own, one per state directory, as the TTL reaper does
// (Config.Dir, <state-dir>/broker by vmfork's convention):
//
//   - Started on demand: Client.Register (what a fork or boot with
//     brokered secrets calls, once the machine's placeholders are in its
//     guest) pings the control socket and, if none answers and the lock
//     is free, calls its Starter, which starts `vmfork broker` in a session
//     of its own (no terminal's signals reach it) and waits for it to
//     answer. Only one broker runs per directory: it holds broker.lock
//     (flock) for its whole life and writes its PID to broker.pid; a
//     second one exits at once (ErrRunning). Control requests come over
//     broker.sock (0600; the peer must be the broker's user or root).
//   - The broker opens each machine's listener itself, so the listeners
//     outlive the command that registered the machine, and keeps the
//     registered machines, without values, in children.json (0600).
//   - Supervised by the next command: nothing restarts a broker that dies
//     (or is killed) on its own. Its machines' proxies then refuse
//     connections (nothing listens; never a pass-through without the
//     secrets' rules), until a vmfork command calls Client.Revive, which
//     starts a broker if the registry lists a machine and none answers.
//     The new broker serves every listed machine again at the same
//     address, resolving exec and file values itself (hooks run with the
//     environment of the command that started it). Env values cannot be
//     had again: such a machine's requests that carry the placeholder to a
//     bound host are answered 503, naming the secret, until it is
//     registered again with its value (Revive returns those machines).
//   - Stopped: Unregister (machine removed) closes a machine's listener and
//     every connection to it; a machine whose QEMU (Child.PID) is gone is
//     dropped by the broker itself; and the broker exits once no machine
//     has been registered for Config.Idle (from its start, or from the
//     last Unregister). A Register that reaches an exiting broker gets
//     ErrExiting and the Client goes on to the next one. SIGTERM stops it
//     too, keeping the registry for the next one. Unregister with no
//     broker running edits the registry under the lock.
package broker
