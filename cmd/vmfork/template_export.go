package main

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/vmfork/vmfork"
)

var templateExportCommand = &cli.Command{
	Name:      "export",
	Usage:     "write template NAME into one archive FILE, to import on another host",
	ArgsUsage: "NAME FILE",
	Description: `Writes kept template NAME (or a template id) into FILE: a zstd-compressed tar
stream with the template's manifest and, for every file (frozen RAM, device
state, the disk chain flattened into one qcow2, kernel, initrd), its sha256.
Holes and all-zero pages are not stored. FILE appears whole or not at all.
Progress goes to stderr.

With --base OLD, FILE is a delta archive for a host that keeps template OLD
already (yesterday's golden image): only the 2 MiB chunks of NAME that OLD's
chunk map lacks and, of each, only the 4 KiB pages that differ from OLD's
chunk at the same place, as "template push" would send them. OLD is named in
it by the sha256 of its chunk map: "template import" refuses the archive on a
host without OLD, or whose OLD holds other bytes (the same name, another
template), before writing anything. A delta archive is never written over an
existing FILE.

   vmfork template export golden golden.vmt
   vmfork template export golden-v2 --base golden v2.vmd   # then, on the other host:
   vmfork template import v2.vmd`,
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "base", Usage: "write a delta archive: only what template `OLD` (kept on the importing host) lacks"},
		jsonFlag,
	},
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() != 2 {
			return usageError{errors.New("template export needs a template and a file: vmfork template export NAME FILE")}
		}
		return run(cliCtx, func(v verb) error {
			res, err := v.mg.Export(v.ctx, vmfork.ExportRequest{
				Name: cliCtx.Args().Get(0), File: cliCtx.Args().Get(1), Base: cliCtx.String("base"), Progress: byteProgress("export"),
			})
			return show(v, res, err, func(res *vmfork.ExportResult) {
				if res.Base != "" {
					fmt.Printf("exported template %s (%s) against %s to %s: %.1f MiB (%d of %d chunks, %.1f MiB of them) in %.0f ms\n",
						orDash(res.Name), res.ID, res.Base, res.File, mib(res.Archive), res.ChunksStored, res.Chunks, mib(res.Stored), res.Elapsed)
					return
				}
				fmt.Printf("exported template %s (%s) to %s: %.1f MiB (%.1f MiB of data, %.1f MiB with holes) in %.0f ms\n",
					orDash(res.Name), res.ID, res.File, mib(res.Archive), mib(res.Stored), mib(res.Logical), res.Elapsed)
			})
		})
	},
}

var templateImportCommand = &cli.Command{
	Name:      "import",
	Usage:     "import a template archive FILE as a kept template",
	ArgsUsage: "FILE",
	Description: `Reads an archive written by "template export". Its manifest is checked against
this host first (driver, QEMU version, machine type, CPU model and flags, RAM
size, device list): a mismatch is refused naming the field and both values.
Every file's sha256 is checked; a corrupted or truncated archive is refused
and leaves nothing behind. The template is kept under the name it was
exported with, or --as NAME.

A delta archive (export --base OLD) is rebuilt over this host's template OLD:
the chunks it carries over OLD's chunks, each checked against its sha256,
the rest from OLD. Without OLD, or with another template of that name (its
chunk map's sha256 differs), it is refused naming OLD before anything is
written: import or pull OLD first.

   vmfork template import golden.vmt --as golden2
   vmfork fork golden2 --count 4`,
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "as", Usage: "keep the template under this name"},
		jsonFlag,
	},
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() != 1 {
			return usageError{errors.New("template import needs an archive file: vmfork template import FILE [--as NAME]")}
		}
		return run(cliCtx, func(v verb) error {
			res, err := v.mg.Import(v.ctx, vmfork.ImportRequest{
				File: cliCtx.Args().First(), As: cliCtx.String("as"), Progress: byteProgress("import"),
			})
			return show(v, res, err, func(res *vmfork.ImportResult) {
				over := ""
				if res.Base != "" {
					over = " over " + res.Base
				}
				fmt.Printf("imported template %s (%s, of %s)%s: %.1f MiB of data in %.0f ms\n",
					res.Name, res.ID, res.Source, over, mib(res.Stored), res.Elapsed)
			})
		})
	},
}

func mib(n int64) float64 { return float64(n) / (1 << 20) }

// byteProgress reports a transfer on stderr, at most twice a second, on one
// redrawn line when stderr is a terminal and as plain lines otherwise.
func byteProgress(what string) func(done, total int64) {
	var last time.Time
	tty := isTerminal(os.Stderr)
	return func(done, total int64) {
		final := done >= total
		if !final && time.Since(last) < 500*time.Millisecond {
			return
		}
		last = time.Now()
		pct := 100.0
		if total > 0 {
			pct = 100 * float64(done) / float64(total)
		}
		end := "\n"
		if tty {
			end = ""
			if final {
				end = "\n"
			}
			fmt.Fprint(os.Stderr, "\r")
		}
		fmt.Fprintf(os.Stderr, "%s: %.1f of %.1f MiB (%.0f%%)%s", what, mib(done), mib(total), pct, end)
	}
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
