// Package mcpserver is vmfork for AI agents: a Model Context Protocol
// server (github.com/modelcontextprotocol/go-sdk) whose tools are thin
// calls of the root package's Manager (fork, exec, read_file, write_file,
// explore, checkpoint, rewind, ls, tree, rm, ledger).
//
// The operator, not the agent, sets the limits (Limits) when the server
// starts: which sources the agent may fork, how many machines it may hold
// and make per call, the TTL every machine it makes gets (a default and a
// maximum), the contract every child gets (the agent may narrow it, never
// widen it) and, optionally, which commands exec may run. A request beyond
// a limit is a tool error that names the limit ("limit max-machines: ...")
// and changes nothing: every check runs before the Manager is called.
//
// The agent sees and touches only what it made, plus the sources it was
// given, read-only. What it made is kept in a file of the state dir
// (<state-dir>/mcp/<agent>.json, owner.go) so that a restarted server
// still knows, and a machine of the same name made later by someone else
// is not mistaken for it (the record's creation time must match).
//
// Cancellation: a tool call's context is the request's; a cancelled fork
// is the Manager's cancelled fork, which the journal leaves with nothing
// half-made, as for a killed vmfork command.
package mcpserver
