package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/vmfork/vmfork"
)

var cpCommand = &cli.Command{
	Name:      "cp",
	Usage:     "copy a file into or out of a machine through its guest agent",
	ArgsUsage: "SRC DST",
	Description: `Copies one file between the host and a machine, through qemu-guest-agent's
file calls: no network or SSH is needed. One of SRC and DST is NAME:PATH, a
machine and an absolute path in its guest; the other is a host path, or - for
standard input or output. A guest file is replaced whole; a new one gets the
guest agent's umask. The file is held in memory on the way, so this is for
configuration files and scripts, not disk images. (The Ansible connection
plugin vmfork.vmfork.agent moves its module files this way.)

   vmfork cp ./motd web-1:/etc/motd
   vmfork cp web-1:/etc/hostname -
   echo hello | vmfork cp - web-1:/tmp/greeting`,
	Flags: []cli.Flag{jsonFlag},
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() != 2 {
			return usageError{errors.New("cp needs a source and a destination: vmfork cp SRC DST, one of them NAME:PATH")}
		}
		src, dst := cliCtx.Args().Get(0), cliCtx.Args().Get(1)
		srcName, srcPath, srcGuest := guestRef(src)
		dstName, dstPath, dstGuest := guestRef(dst)
		if srcGuest == dstGuest {
			return usageError{fmt.Errorf("cp %s %s: exactly one of SRC and DST must be NAME:/PATH in a machine", src, dst)}
		}
		name, guestPath := srcName, srcPath
		if dstGuest {
			name, guestPath = dstName, dstPath
		}
		if err := vmfork.ValidateName(name); err != nil {
			return usageError{fmt.Errorf("cp: %w", err)}
		}
		if !strings.HasPrefix(guestPath, "/") {
			return usageError{fmt.Errorf("cp: guest path %q must be absolute", guestPath)}
		}
		// Read a host source before touching the machine: bad input changes nothing.
		var data []byte
		if dstGuest {
			var err error
			if data, err = readHost(src); err != nil {
				return usageError{fmt.Errorf("cp: %w", err)}
			}
		}
		return run(cliCtx, func(v verb) error {
			m, err := v.mg.Get(v.ctx, name)
			if err != nil {
				return fmt.Errorf("cp: %w", err)
			}
			if m.State != vmfork.StateRunning {
				return fmt.Errorf("cp: machine %q is %s: %w", name, m.State, vmfork.ErrNotRunning)
			}
			agent, err := v.mg.Driver.Agent(v.ctx, m)
			if err != nil {
				return fmt.Errorf("cp %q: %w", name, err)
			}
			defer agent.Close()
			direction := "to"
			if dstGuest {
				if err := agent.WriteFile(v.ctx, guestPath, data); err != nil {
					return fmt.Errorf("cp to %s:%s: %w", name, guestPath, err)
				}
			} else {
				direction = "from"
				if data, err = agent.ReadFile(v.ctx, guestPath); err != nil {
					return fmt.Errorf("cp from %s:%s: %w", name, guestPath, err)
				}
				if dst == "-" {
					// Stdout carries the file itself; --json would garble it.
					_, err := os.Stdout.Write(data)
					return err
				}
				if err := writeHost(dst, data); err != nil {
					return fmt.Errorf("cp from %s:%s: %w", name, guestPath, err)
				}
			}
			if cliCtx.Bool("json") {
				return printJSON(map[string]any{"machine": name, "path": guestPath, "direction": direction, "size_bytes": len(data)})
			}
			return nil
		})
	},
}

// guestRef splits NAME:PATH. A host path that holds a colon can be given as
// ./a:b; a machine name never holds a slash or a dot.
func guestRef(s string) (name, path string, ok bool) {
	name, path, ok = strings.Cut(s, ":")
	if !ok || name == "" || strings.ContainsAny(name, "/.") {
		return "", "", false
	}
	return name, path, true
}

func readHost(p string) ([]byte, error) {
	if p == "-" {
		return io.ReadAll(os.Stdin)
	}
	return os.ReadFile(p)
}

// writeHost replaces host file p through a temp file and a rename, so a
// failed copy leaves the old file.
func writeHost(p string, data []byte) error { return vmfork.WriteFileAtomic(p, data, 0o644) }
