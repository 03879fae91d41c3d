package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/urfave/cli/v2"

	"github.com/vmfork/vmfork/contract"
	"github.com/vmfork/vmfork/mcpserver"
)

// mcpTokenEnv holds the HTTP transport's bearer token when --token-file
// does not: a token on the command line would show in ps.
const mcpTokenEnv = "VMFORK_MCP_TOKEN"

var mcpCommand = &cli.Command{
	Name:  "mcp",
	Usage: "serve vmfork's tools to an AI agent over the Model Context Protocol, within limits the agent cannot lift",
	Description: `Runs an MCP server: on stdin and stdout by default (an MCP client starts it as
a subprocess), or with --listen over streamable HTTP on a unix socket or a
TCP address, every request carrying the bearer token the operator set
(--token-file or VMFORK_MCP_TOKEN; the server does not start without one).

Tools: fork, exec, read_file, write_file, explore, checkpoint, rewind, ls,
tree, rm, ledger. The limits are the operator's, set here: the agent forks
only the --source machines and kept templates (read-only to it) and the
machines it made; holds at most --max-machines, makes at most
--max-children per call; every machine it makes has a TTL (--ttl, at most
--ttl-max), so losers die even when the agent crashes; every child gets
--contract (the agent may narrow it, never widen it); with --exec-allow,
exec runs only those commands. It sees and touches only what it made,
recorded in <state-dir>/mcp/<agent>.json. A call beyond a limit is a tool
error "limit NAME: ..." and changes nothing.

   vmfork mcp --source web --max-machines 8 --ttl 30m
   VMFORK_MCP_TOKEN=$(cat tok) vmfork mcp --source web --listen unix:/run/vmfork-mcp.sock`,
	Flags: []cli.Flag{
		&cli.StringSliceFlag{Name: "source", Usage: "machine or kept `NAME` the agent may fork (read-only to it); repeatable"},
		&cli.StringFlag{Name: "agent", Value: "agent", Usage: "`NAME` of the agent: its machines are named NAME-N and kept apart from other agents'"},
		&cli.IntFlag{Name: "max-machines", Value: mcpserver.DefaultMaxMachines, Usage: "most machines the agent holds at once"},
		&cli.IntFlag{Name: "max-children", Value: mcpserver.DefaultMaxChildren, Usage: "most machines one call makes (fork's children, explore's tries)"},
		&cli.DurationFlag{Name: "ttl", Value: mcpserver.DefaultTTL, Usage: "TTL of a machine whose call names none"},
		&cli.DurationFlag{Name: "ttl-max", Value: mcpserver.DefaultTTLMax, Usage: "longest TTL a call may name"},
		&cli.StringFlag{Name: "contract", Usage: "fork contract `FILE` (YAML or JSON) every child gets; the agent may only narrow it"},
		&cli.StringSliceFlag{Name: "exec-allow", Usage: "`COMMAND` exec may run (by name); repeatable; none: any"},
		&cli.IntFlag{Name: "output-bytes", Value: mcpserver.DefaultOutputBytes, Usage: "stdout and stderr tail a tool returns, in bytes"},
		&cli.IntFlag{Name: "file-bytes", Value: mcpserver.DefaultFileBytes, Usage: "largest file read_file and write_file move, in bytes"},
		&cli.StringFlag{Name: "listen", Usage: "serve streamable HTTP on `ADDR` (unix:PATH or HOST:PORT) instead of stdio"},
		&cli.StringFlag{Name: "token-file", Usage: "`FILE` holding the HTTP bearer token (else VMFORK_MCP_TOKEN)"},
	},
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() != 0 {
			return usageError{fmt.Errorf("mcp takes no arguments, got %q", cliCtx.Args().First())}
		}
		lim := mcpserver.Limits{
			Agent: cliCtx.String("agent"), Sources: cliCtx.StringSlice("source"),
			MaxMachines: cliCtx.Int("max-machines"), MaxChildren: cliCtx.Int("max-children"),
			TTLDefault: cliCtx.Duration("ttl"), TTLMax: cliCtx.Duration("ttl-max"),
			ExecAllow: cliCtx.StringSlice("exec-allow"), OutputBytes: cliCtx.Int("output-bytes"), FileBytes: cliCtx.Int("file-bytes"),
		}
		if err := lim.Validate(); err != nil {
			return usageError{err}
		}
		if f := cliCtx.String("contract"); f != "" {
			c, err := contract.Load(absPath(f))
			if err != nil {
				return usageError{fmt.Errorf("--contract: %w", err)}
			}
			lim.Contract = c
		}
		listen := cliCtx.String("listen")
		token, err := mcpToken(cliCtx)
		if err != nil {
			return err
		}
		if listen == "" && token != "" && cliCtx.IsSet("token-file") {
			return usageError{errors.New("--token-file goes with --listen: stdio needs no token")}
		}
		if listen != "" {
			if err := mcpserver.CheckToken(token); err != nil {
				return usageError{fmt.Errorf("--listen %s: %w", listen, err)}
			}
		}
		return run(cliCtx, func(v verb) error {
			c, err := ledgerClient(cliCtx)
			if err != nil {
				return err
			}
			srv, err := mcpserver.New(mcpserver.Config{Manager: v.mg, Limits: lim, Ledger: c})
			if err != nil {
				return err
			}
			if listen == "" {
				// A client that dies closes our stdout: writing to it must
				// be an error the session ends on (and its calls are
				// cancelled and undone), not a SIGPIPE that kills the
				// server mid-fork. Notify, unlike Ignore, is not inherited
				// by the processes vmfork starts.
				signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
				err := srv.Run(v.ctx, &mcp.StdioTransport{})
				if errors.Is(err, syscall.EPIPE) {
					// The client went away while we wrote: its end, not ours.
					v.mg.Log.Info("mcp: the client closed the connection")
					return nil
				}
				return err
			}
			l, err := mcpserver.Listen(listen)
			if err != nil {
				return err
			}
			if !mcpserver.IsLoopback(listen) {
				v.mg.Log.Warnf("mcp: %s is reachable from the network; only the bearer token guards it", listen)
			}
			v.mg.Log.Infof("mcp: serving agent %q on %s", lim.Agent, listen)
			return srv.ServeHTTP(v.ctx, l, token)
		})
	},
}

// mcpToken reads the bearer token from --token-file, else VMFORK_MCP_TOKEN.
func mcpToken(cliCtx *cli.Context) (string, error) {
	if f := cliCtx.String("token-file"); f != "" {
		data, err := os.ReadFile(f)
		if err != nil {
			return "", usageError{fmt.Errorf("--token-file: %w", err)}
		}
		return strings.TrimSpace(string(data)), nil
	}
	return os.Getenv(mcpTokenEnv), nil
}
