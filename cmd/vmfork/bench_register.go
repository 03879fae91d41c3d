package main

import "github.com/urfave/cli/v2"

// extraCommands are commands that only some builds have: `vmfork bench`
// (bench.go) is compiled in with -tags bench alone, so the product binary
// carries none of the benchmark harness (tests/bench) nor the peers it
// drives. `make build-bench` builds bin/vmfork-bench with it.
var extraCommands []*cli.Command
