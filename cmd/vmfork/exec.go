package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/vmfork/vmfork"
)

var execCommand = &cli.Command{
	Name:      "exec",
	Usage:     "run a command in a machine through its guest agent",
	ArgsUsage: "NAME -- COMMAND [ARG...]",
	Description: `Runs COMMAND in the guest through qemu-guest-agent (guest-exec), waits for
it to exit, passes its stdout and stderr through and exits with its exit code.
No network or SSH is needed. The command is looked up on the guest's PATH.

   vmfork exec web -- uname -r
   echo hello | vmfork exec web --stdin -- cat`,
	Flags: []cli.Flag{
		&cli.BoolFlag{Name: "stdin", Aliases: []string{"i"}, Usage: "send this command's standard input to the guest command"},
		&cli.StringSliceFlag{Name: "env", Aliases: []string{"e"}, Usage: "set KEY=VALUE in the guest command's environment; repeatable"},
		jsonFlag,
	},
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() < 2 {
			return usageError{fmt.Errorf("exec needs a machine name and a command: vmfork exec NAME -- COMMAND [ARG...]")}
		}
		args := cliCtx.Args().Slice()
		req := vmfork.ExecRequest{Argv: args[1:], Env: cliCtx.StringSlice("env")}
		for _, kv := range req.Env {
			if k, _, ok := strings.Cut(kv, "="); !ok || k == "" || strings.ContainsAny(k, "\x00") {
				return usageError{fmt.Errorf("--env %q: want KEY=VALUE", kv)}
			}
		}
		if cliCtx.Bool("stdin") {
			in, err := io.ReadAll(os.Stdin)
			if err != nil {
				return fmt.Errorf("read stdin: %w", err)
			}
			req.Stdin = in
		}
		return run(cliCtx, func(v verb) error {
			st, err := v.mg.Exec(v.ctx, args[0], req)
			if err != nil {
				return err
			}
			if cliCtx.Bool("json") {
				if err := printJSON(map[string]any{
					"exit_code": st.ExitCode, "signal": st.Signal,
					"stdout": string(st.Stdout), "stderr": string(st.Stderr),
				}); err != nil {
					return err
				}
			} else {
				os.Stdout.Write(st.Stdout)
				os.Stderr.Write(st.Stderr)
			}
			if code := guestExitCode(st.ExitCode, st.Signal); code != 0 {
				return exitError{code}
			}
			return nil
		})
	},
}

// guestExitCode follows the shell: a command killed by signal N exits 128+N.
func guestExitCode(code, signal int) int {
	if signal > 0 {
		return 128 + signal
	}
	return code
}
