// Package ledger is the family ledger: it answers, for a program in any
// guest, "has any machine of my family already done this?" before the
// program does something the hypervisor cannot take back (send an email,
// charge a card, run a migration against a shared database).
//
// # Model
//
// A family is a root machine and everything made from it: fork children,
// forks of forks, kept templates and their children, checkpoints and
// rewinds, explore branches, hibernated and resumed machines. The host
// names each family with an id and each machine with its name; both reach
// the ledger only from the host (Machine, registered by vmfork), never from
// what a guest writes, so a guest can neither read nor change another
// family's records. A rewind replaces a machine's state in place and keeps
// its name, so to the ledger it is the same machine.
//
// A family's ledger holds one Record per key: the machine that claimed it
// (its holder), when, and its state:
//
//	claimed   granted to the holder; its effect not reported done
//	done      the holder reported the effect done, with an optional result
//	released  given up; the next claim is granted to whoever asks
//
// The pattern is claim, then the effect, then done. A machine that dies
// or is rewound between claim and done leaves the key claimed: nobody
// else is granted it, and the holder itself, asking again, is told the
// claim is its own (`yours`), so it knows that the effect may or may not
// have happened and must find out (or use the effect's own idempotency
// key) before doing it again. An operator releases a claim whose holder
// is gone for good (Client.Release: vmfork ledger NAME --release KEY);
// explore releases a reaped losing branch's claims that are not done
// (Client.ReleaseHeldBy: its effects never happened) and keeps its done
// ones.
//
// # Protocol
//
// Each machine has a virtio-serial port named org.vmfork.ledger.0
// (PortName; /dev/virtio-ports/org.vmfork.ledger.0 in the guest): a byte
// stream carrying request lines, each answered by one line (list: a
// header and its lines), in order. Lines end with LF (a CR before it is
// dropped). AT is a time in RFC 3339, UTC, with milliseconds
// (TimeFormat). KEY is 1 to 200 bytes of UTF-8 with no space or control
// character; RESULT is the rest of the line, at most 1 KiB, no control
// character.
//
//	claim KEY          granted                         the key is now this machine's
//	                   yours AT                        it already was (its own claim of AT)
//	                   yours AT done [RESULT]          ... and this machine reported it done
//	                   taken HOLDER AT                 HOLDER claimed it at AT
//	                   taken HOLDER AT done [RESULT]   ... and did it
//	done KEY [RESULT]  ok                              (again by the holder: ok, the first result kept)
//	release KEY        ok                              the holder gives it up (not once done)
//	get KEY            none | claimed HOLDER AT | done HOLDER AT [RESULT] | released HOLDER AT
//	                   (AT: of the claim, the done, the release)
//	list [AFTER]       list N [more], then N lines: KEY claimed|done|released HOLDER AT [RESULT]
//	ping [TOKEN]       pong [TOKEN]
//
// list answers the records in key order, at most ListPage (1000) at a
// time, after key AFTER if given; "more" says another page follows: ask
// `list LASTKEY`. A shell reads the header with `read -r word n more`,
// then n lines. ping lets a client skip answers it did not wait for: the
// helper sends an empty line (ending any half-written line) and `ping
// TOKEN` and reads up to `pong TOKEN` before its request.
//
// Anything else is answered by one line starting with "error", and
// nothing is recorded:
//
//	error empty request | error unknown verb | error missing key
//	error too many arguments | error bad key | error key too long
//	error bad result | error result too long | error line too long
//	error not holder HOLDER | error not claimed | error already done
//	error busy | error full | error storage | error unavailable
//
// A line over MaxLine (4 KiB) is read up to its newline, dropped and
// answered `error line too long`: the stream goes on at the next line.
//
// # Bounds
//
// Per request: key 200 bytes, result 1 KiB, line 4 KiB. Per machine: a
// token bucket (DefaultRate: 500 requests a second, bursts of 200); a
// request that finds it empty is answered `error busy` and does nothing,
// so a flood costs the server one line buffer and one answer at a time,
// never a queue. Per family (Limits): at most 100 000 records and a log
// of at most 64 MiB, of which live records take at most half; past
// either, a claim of a new key (or a done that would grow the log) is
// answered `error full`, while claims of existing keys, gets and releases
// go on. Memory per family is about its live records (at most 32 MiB);
// families no running machine belongs to are closed after a minute.
// Disk per family: its log, plus a compacted copy while one is written.
//
// # Durability
//
// Every change is written to the family's log and fdatasynced before it is
// answered, and so is every record an answer reflects (a `taken` is never
// told of a claim a crash could still take back). A granted claim
// therefore survives a kill -9 of the server and a host crash. The server
// can die after the sync and before the answer: the claim stands, the
// guest sees no answer (its helper times out, or, once a server is back,
// asks again) and its retry of `claim KEY` gets `yours AT`, its own claim,
// exactly as a machine rewound to before its claim does. A write a crash
// interrupts was never answered; it is cut from the log when the family
// is next opened (log.go says how torn tails are told from damage).
//
// # Serving
//
// One server per state dir serves every running machine (Server; the
// process `vmfork ledger-server`). Why one and not one per machine: a
// family's machines must agree on each claim, which one process with the
// family's log open does with a mutex, where per-machine servers would
// need a lock file per family and re-read the log on every request; and a
// fork of a hundred children should not start a hundred processes.
//
// Each machine's QEMU listens on a unix socket for the port
// (-chardev socket,path=<machine dir>/ledger.sock,server=on,wait=off); the
// server connects to it as a client, so a QEMU never waits for the ledger
// and the server can come and go. When the stream ends (QEMU exited or was
// replaced) it connects again, until the machine is detached or its socket
// has been unreachable for DropAfter (a minute).
//
// Lifecycle. vmfork calls Client.Attach whenever a machine's QEMU starts
// (boot, fork, resume, start, rewind) and Client.Detach when it stops.
// Attach starts a server when none answers on <dir>/control.sock (the
// Client's Start: `vmfork ledger-server`, detached in its own session as
// the TTL reaper is) and waits until it answers. The server holds
// <dir>/server.lock (flock) while it runs, so only one serves a state dir
// (a second one started at the same moment sees it answer and exits), and
// writes its PID to <dir>/server.pid. On start it attaches the machines
// that run (ServerOptions.Discover, or the registrations it saved in
// machines.json). It exits once no machine has been attached for
// IdleExit (a minute), after one last Discover. If it dies (kill -9, OOM,
// host reboot), the next vmfork command that starts a machine starts
// another; meanwhile a guest's port is open but unanswered (writes block,
// or reads see the host side closed), and the helper gives up after its
// timeout with a message that says so. Nothing is lost: answers were
// synced first.
//
// The control socket (0600 in a 0700 directory) carries one JSON request
// per connection for vmfork commands: attach, detach, machines, list,
// get, release, release_held_by, keys_of. With no server running, the
// Client does the record requests itself on the Store, under the
// server's lock.
//
// # Guest helper
//
// Helper is vmfork-ledger, a POSIX shell script (busybox sh, dash) that
// needs nothing but the port: `vmfork-ledger claim KEY`, `done KEY
// [RESULT]`, `release KEY`, `get KEY`, `list`, `ping`. It exits 0 when the
// effect is this machine's to do (granted, yours and not done) or the
// request succeeded, 1 when it is not (taken, or yours and done), 2 on
// error; invocations in one guest take turns (flock, or a lock directory).
//
// This package imports nothing of vmfork; vmfork registers machines by
// name, family id and socket path.
package ledger
