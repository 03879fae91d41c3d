package main

import (
	"strings"

	"github.com/urfave/cli/v2"
)

// normalizeArgs lets flags follow positional arguments, as in
// `vmfork boot g --memory 1G`. urfave/cli v2 stops parsing flags at a
// command's first positional argument, so this moves the command's flags
// (with their values) in front of its positionals and puts the positionals
// behind "--". Everything after a "--" the user typed stays positional
// (`vmfork exec g -- ls -l`), and that "--" is dropped. A global flag
// given after the command (`vmfork boot g --timeout 5m`) moves in front of
// the command, where urfave looks for it, unless the command has a flag of
// that name itself.
func normalizeArgs(app *cli.App, args []string) []string {
	if len(args) < 2 {
		return args
	}
	out := []string{args[0]}
	i := 1
	// Global flags up to the command name.
	for ; i < len(args); i++ {
		t := args[i]
		if !isFlag(t) {
			break
		}
		out = append(out, t)
		if takesValue(app.Flags, t) && i+1 < len(args) {
			i++
			out = append(out, args[i])
		}
	}
	if i >= len(args) {
		return out
	}
	cmd := app.Command(args[i])
	globalEnd := len(out)
	var globals []string
	// global moves rest[j] (and its value) to the global flags when only the
	// app knows it, and says how many tokens it took.
	global := func(c *cli.Command, rest []string, j int) int {
		t := rest[j]
		if knows(c.Flags, t) || !knows(app.Flags, t) {
			return 0
		}
		globals = append(globals, t)
		if takesValue(app.Flags, t) && j+1 < len(rest) {
			globals = append(globals, rest[j+1])
			return 2
		}
		return 1
	}
	out = append(out, args[i])
	rest := args[i+1:]
	// A command with subcommands (vmfork libvirt check ...): its own flags
	// come first, then the subcommand's name, whose arguments are reordered.
	for cmd != nil && len(cmd.Subcommands) > 0 {
		j := 0
		for ; j < len(rest) && isFlag(rest[j]); j++ {
			if n := global(cmd, rest, j); n > 0 {
				j += n - 1
				continue
			}
			out = append(out, rest[j])
			if takesValue(cmd.Flags, rest[j]) && j+1 < len(rest) {
				j++
				out = append(out, rest[j])
			}
		}
		if j >= len(rest) {
			return spliceGlobals(out, globalEnd, globals)
		}
		out = append(out, rest[j])
		cmd, rest = cmd.Command(rest[j]), rest[j+1:]
	}
	if cmd == nil {
		return spliceGlobals(append(out, rest...), globalEnd, globals)
	}
	var flags, pos []string
	for j := 0; j < len(rest); j++ {
		t := rest[j]
		switch {
		case t == "--":
			pos = append(pos, rest[j+1:]...)
			j = len(rest)
		case isFlag(t):
			if n := global(cmd, rest, j); n > 0 {
				j += n - 1
				continue
			}
			flags = append(flags, t)
			if takesValue(cmd.Flags, t) && j+1 < len(rest) {
				j++
				flags = append(flags, rest[j])
			}
		default:
			pos = append(pos, t)
		}
	}
	out = append(out, flags...)
	if len(pos) > 0 {
		out = append(append(out, "--"), pos...)
	}
	return spliceGlobals(out, globalEnd, globals)
}

// spliceGlobals puts globals into out at index at (just before the command).
func spliceGlobals(out []string, at int, globals []string) []string {
	if len(globals) == 0 {
		return out
	}
	res := make([]string, 0, len(out)+len(globals))
	res = append(res, out[:at]...)
	res = append(res, globals...)
	return append(res, out[at:]...)
}

// knows reports whether flag token t (with or without "=value") names one of
// flags.
func knows(flags []cli.Flag, t string) bool {
	name, _, _ := strings.Cut(strings.TrimLeft(t, "-"), "=")
	for _, f := range flags {
		for _, n := range f.Names() {
			if n == name {
				return true
			}
		}
	}
	return false
}

func isFlag(t string) bool { return len(t) > 1 && strings.HasPrefix(t, "-") && t != "--" }

// takesValue reports whether flag token t (without "=value") names a flag
// that takes a value. Unknown flags are left for urfave to report.
func takesValue(flags []cli.Flag, t string) bool {
	if strings.Contains(t, "=") {
		return false
	}
	name := strings.TrimLeft(t, "-")
	for _, f := range flags {
		for _, n := range f.Names() {
			if n == name {
				_, isBool := f.(*cli.BoolFlag)
				return !isBool
			}
		}
	}
	return false
}
