// Package qmp speaks the QEMU Machine Protocol to a running QEMU (Monitor) and the guest-agent
// protocol to qemu-ga inside the guest (Agent). It is a leaf: it knows QEMU 7.2's wire formats and
// nothing about machines, templates or forks.
//
// # The monitor model
//
// Dial connects to QEMU's QMP unix socket, reads the greeting and sends qmp_capabilities. From then
// on one reader goroutine owns the socket's read side for the life of the Monitor. It sorts every
// message QEMU sends into one of two streams:
//
//   - Replies. Every command the Monitor sends carries a fresh "id", and QEMU echoes it in the
//     reply. The reader hands a reply to the caller that registered that id, and only to it.
//   - Events. An event is appended to a queue per subscriber (see Monitor.Events). The queues are
//     unbounded, so the reader never waits for a subscriber: a subscriber that stops reading costs
//     memory until its context ends, but it can never delay a reply. Dropping events instead
//     would lose the MIGRATION or SHUTDOWN event a caller is waiting for.
//
// Writes are serialized; each command is one write of one JSON line, so any number of goroutines
// may call Execute at once.
//
// # What a cancel does
//
// Every call takes a context and selects on its reply, on ctx.Done() and on Done(). When ctx ends
// first, the call returns ctx.Err() (wrapped, naming the command) and forgets its id, so the late
// reply is dropped by the reader and never answers a later command. The connection stays usable.
// The command itself is not undone: QMP has no general cancel, and QEMU may still run it (a
// "migrate" still migrates; use migrate_cancel). If ctx ends after only part of the command was
// written, the Monitor closes the connection, because a partial JSON object would corrupt every
// command after it.
//
// # When QEMU exits
//
// When the socket reaches EOF the reader closes Done(), every pending and later call fails with an
// error that wraps ErrClosed and names the command, and every event channel is closed after its
// queued events. Waiters (WaitEvent here, qemustate.WaitMigration) therefore notice a QEMU that
// died mid-wait immediately instead of at their deadline.
//
// # The Executor
//
// Executor is the two-method core of Monitor (Execute, ExecuteWithFile). Code that only runs
// commands takes an Executor, not a *Monitor: where libvirt owns the QMP socket, its driver
// provides one through libvirt's monitor passthrough, encoding and decoding with EncodeCommand
// and DecodeReply. The QEMU state sequences built on it (the device-state save and load, the
// migration waits) are package qemustate's; the plain commands they need, such as getfd
// (GetFD), are here.
//
// # go-qemu: its types, not its SocketMonitor
//
// go-qemu's qmp.SocketMonitor (github.com/digitalocean/go-qemu @ ee9b066) is not used as the
// transport, for the reasons the project's QEMU reference gives (qemu-fork-mechanics.md §13):
//
//   - Its reader is a bufio.Scanner with the default 64 KiB token limit, and one longer line kills
//     it. QEMU 7.2's query-qmp-schema reply alone is a 207 000-byte line.
//   - Events and replies share unbuffered channels from one reader, so once Events has been
//     called one undrained event stalls every later reply (cf. go-qemu PR #158).
//   - Run takes no context and has no deadline (open go-qemu PR #206), so a wedged QEMU hangs the
//     caller, and Connect can hang too (go-qemu issue #214).
//   - Run returns the scanner's own buffer, uncopied, which the reader's next Scan may overwrite.
//
// go-qemu serves as the wire vocabulary instead: every command this package encodes (Monitor's,
// EncodeCommand's for libvirt's passthrough, the Agent's) is go-qemu's qmp.Command, with an id
// added on a Monitor, and Greeting.Version is go-qemu's qmp.Version. Its generated qmp/raw is not
// used either: it follows the QEMU 2.11 schema, which lacks x-ignore-shared among others.
//
// # The guest agent
//
// qemu-ga has no greeting and no qmp_capabilities. A fresh connection may carry leftovers from an
// earlier client (a forked guest's agent can even hold half a request), so the Agent's socket
// transport sends 0xFF, which resets the agent's JSON parser, and guest-sync-delimited with a random
// id, then discards input until the reply carrying that id (reference §11.3). Each agent command is
// one request and one reply on that synchronized stream. A call whose context ends mid-command
// leaves a stale reply in flight, so the transport marks the stream unsynchronized and the next
// call synchronizes again before sending anything; an I/O error closes the connection and the next
// call redials. The Transport interface lets a libvirt driver carry the same requests over
// virDomainQemuAgentCommand instead.
package qmp
