package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/vmfork/vmfork"
)

var exploreCommand = &cli.Command{
	Name:      "explore",
	Usage:     "fork one branch per try, run each try in its branch, keep the winner, remove the rest",
	ArgsUsage: "SOURCE",
	Description: `Forks SOURCE (a running machine or a kept template) into one branch per --try
(or per non-empty line of --tries-file that does not start with #), runs each
try with /bin/sh -c through the guest agent, bounded by --try-timeout, and
collects its exit code, duration, the tails of its stdout and stderr and the
files it changed under the --watch paths. Then it picks the winner: a try
that exited 0, the fastest first; or, with --score CMD (run in each branch
after its try), the highest number on the last line of CMD's stdout. The
winner stays as an ordinary machine (forked once more into --keep-as NAME if
given); every other branch is removed, also when its try failed or hung
(--keep-all keeps them). If this command is killed, the reaper (or the next
vmfork gc) removes every branch it made. Each try lists the family ledger
keys its branch claimed (vmfork ledger); a removed losing branch's claims
that are not done are released, its done ones stay. Exit code 1 when no try
won.

   vmfork explore web --try 'make test' --try 'make test CC=clang' --json
   vmfork explore golden --tries-file tries.txt --watch /srv/app --score 'cat /tmp/score' \
       --keep-as web-best --parallel 2 --try-timeout 10m --ttl 2h`,
	Flags: []cli.Flag{
		&cli.StringSliceFlag{Name: "try", Aliases: []string{"t"}, Usage: "shell `COMMAND` for one branch; repeatable"},
		&cli.StringFlag{Name: "tries-file", Usage: "read one try per line from `FILE` (- for stdin)"},
		&cli.DurationFlag{Name: "try-timeout", Usage: "bound each try and each score command", Value: vmfork.DefaultTryTimeout},
		&cli.StringSliceFlag{Name: "watch", Usage: "list the files each try changed under guest `PATH`; repeatable"},
		&cli.StringFlag{Name: "score", Usage: "shell `COMMAND` run after each try; the highest number on its last line wins"},
		&cli.StringFlag{Name: "keep-as", Usage: "keep the winner as machine `NAME`"},
		&cli.BoolFlag{Name: "keep-all", Usage: "keep the losing branches too"},
		parallelFlag("branches started and tried at once"),
		maxChildrenFlag("refuse more tries than this"),
		&cli.StringFlag{Name: "prefix", Usage: "name branches PREFIX-1, PREFIX-2, ...", DefaultText: "SOURCE-try"},
		&cli.IntFlag{Name: "tail-bytes", Usage: "bytes of stdout and stderr kept per try", Value: vmfork.DefaultTailBytes},
		ttlFlag,
		contractFlag,
		dryRunFlag,
		jsonFlag,
		traceJSONFlag,
	},
	Action: func(cliCtx *cli.Context) error {
		if cliCtx.NArg() != 1 {
			return usageError{errors.New("explore needs one source: vmfork explore SOURCE --try COMMAND...")}
		}
		if err := checkTTLFlag(cliCtx); err != nil {
			return err
		}
		if err := checkForkLimits(cliCtx); err != nil {
			return err
		}
		if cliCtx.Duration("try-timeout") <= 0 {
			return usageError{fmt.Errorf("--try-timeout %s: want a positive duration", cliCtx.Duration("try-timeout"))}
		}
		tries := cliCtx.StringSlice("try")
		if f := cliCtx.String("tries-file"); f != "" {
			more, err := readTries(f)
			if err != nil {
				return usageError{fmt.Errorf("--tries-file: %w", err)}
			}
			tries = append(tries, more...)
		}
		req := vmfork.ExploreRequest{
			Source: cliCtx.Args().First(), Tries: tries, TryTimeout: cliCtx.Duration("try-timeout"),
			Watch: cliCtx.StringSlice("watch"), Score: cliCtx.String("score"),
			KeepAs: cliCtx.String("keep-as"), KeepAll: cliCtx.Bool("keep-all"),
			Parallel: cliCtx.Int("parallel"), MaxChildren: cliCtx.Int("max-children"),
			TTL: cliCtx.Duration("ttl"), TailBytes: cliCtx.Int("tail-bytes"), Prefix: cliCtx.String("prefix"),
		}
		var err error
		if req.Contract, err = contractOf(cliCtx, nil); err != nil {
			return err
		}
		return run(cliCtx, func(v verb) error {
			return v.planOr(func() (*vmfork.Plan, error) { return v.mg.PlanExplore(v.ctx, req) }, func() error {
				res, err := v.mg.Explore(withProgress(v.ctx, cliCtx), req)
				return show(v, res, err, printExplore)
			})
		})
	},
}

func readTries(path string) ([]string, error) {
	f := os.Stdin
	if path != "-" {
		var err error
		if f, err = os.Open(path); err != nil {
			return nil, err
		}
		defer f.Close()
	}
	var tries []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); line != "" && !strings.HasPrefix(line, "#") {
			tries = append(tries, line)
		}
	}
	return tries, sc.Err()
}

func printExplore(res *vmfork.ExploreResult) {
	tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TRY\tBRANCH\tEXIT\tTIME\tSCORE\tCHANGED\tKEPT\tCOMMAND")
	for _, t := range res.Tries {
		exit := fmt.Sprint(t.ExitCode)
		switch {
		case t.TimedOut:
			exit = "timeout"
		case t.Error != "":
			exit = "error"
		}
		score := "-"
		if t.Score != nil {
			score = fmt.Sprint(*t.Score)
		}
		kept := "-"
		if t.Kept {
			kept = "kept"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%.0f ms\t%s\t%d\t%s\t%s\n", t.Index, t.Branch, exit, t.DurationMS, score, t.ChangedCount, kept, t.Command)
	}
	tw.Flush()
	for _, t := range res.Tries {
		if len(t.Released) > 0 {
			// The family ledger (vmfork ledger): effects claimed, never done.
			fmt.Printf("try %d: released its undone ledger claims %s\n", t.Index, strings.Join(t.Released, " "))
		}
	}
	if res.Winner != "" {
		fmt.Printf("winner: try %d, kept as %s\n", res.WinnerTry, res.Winner)
	} else {
		fmt.Println("no try won")
	}
}
