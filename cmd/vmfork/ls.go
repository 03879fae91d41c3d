package main

import (
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/urfave/cli/v2"
)

var lsCommand = &cli.Command{
	Name:    "ls",
	Aliases: []string{"list"},
	Usage:   "list machines",
	Description: `Lists every machine in the state dir with its actual state: a machine whose
QEMU exited on its own shows as stopped. WHY says why a stopped machine is
stopped, when vmfork can tell (stop_reason in --json): stopped by the user
(user), its QEMU died (qemu-died), or the host restarted and its RAM is gone
(host-restart). vmfork start boots a stopped machine again.`,
	Flags: []cli.Flag{jsonFlag},
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() != 0 {
			return usageError{fmt.Errorf("ls takes no arguments")}
		}
		return run(cliCtx, func(v verb) error {
			ms, err := v.mg.List(v.ctx)
			if err != nil {
				return err
			}
			views := make([]machineView, 0, len(ms))
			for _, m := range ms {
				views = append(views, viewOf(m))
			}
			if cliCtx.Bool("json") {
				return printJSON(views)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tSTATE\tPID\tMEMORY\tCPUS\tPARENT\tTEMPLATE\tHOSTNAME\tPORTS\tTTL\tWHY")
			for _, v := range views {
				var ports []string
				for _, p := range v.Ports {
					ports = append(ports, p.String())
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%dM\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", v.Name, v.State, dash(v.PID), v.MemoryMiB, v.CPUs,
					orDash(v.Parent), orDash(v.Template), orDash(v.Hostname), orDash(strings.Join(ports, ",")), ttlText(v), orDash(v.StopReason.Text()))
			}
			return tw.Flush()
		})
	},
}

func dash(n int) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprint(n)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
