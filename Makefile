# vmfork. The two commands a newcomer needs:
#   make demo   installs what is missing, builds, and runs the demo
#   make test   installs what is missing, builds, runs unit and integration tests
export PATH := /usr/local/go/bin:$(PATH)

# Both test guests are cached outside the checkout, so that fresh clones on
# this machine (CI's) reuse them; each rebuilds only when its inputs change.
GUEST_OUT ?= /var/cache/vmfork/guest
DEBIAN_GUEST ?= /var/cache/vmfork/debian-guest
BIN       ?= $(CURDIR)/bin/vmfork
# The same CLI with `vmfork bench` compiled in (-tags bench); the product
# binary carries no benchmark harness.
BENCH_BIN ?= $(CURDIR)/bin/vmfork-bench
# The same CLI with fault injection compiled in (-tags failpoints: fault.go's
# VMFORK_FAULT, sharedmem's VMFORK_TEST_FREEZE_FAIL), for the tests that
# kill or fail a command on purpose; the product binary holds neither.
FAILPOINTS_BIN ?= $(CURDIR)/bin/vmfork-failpoints
GO        ?= go

.PHONY: fuzz all deps build guest guest-debian demo test shellcheck unit integration bench bench-peers bench-peers-used bench-burst bench-scale bench-contract bench-network bench-all crash-matrix vet clean ansible-unit python-test bench-mcp

all: build

deps:
	@scripts/deps.sh
	@scripts/mcp-client-deps.sh

build:
	$(GO) build -o $(BIN) ./cmd/vmfork
	$(GO) build -tags bench -o $(BENCH_BIN) ./cmd/vmfork
	$(GO) build -tags failpoints -o $(FAILPOINTS_BIN) ./cmd/vmfork
	@if grep -aqE 'VMFORK_FAULT|VMFORK_TEST' $(BIN); then \
		echo "$(BIN) holds a test hook's variable (VMFORK_FAULT or VMFORK_TEST_*): it belongs behind -tags failpoints" >&2; exit 1; fi

guest: deps
	@tests/guest/build.sh $(GUEST_OUT) >/dev/null

# A stock Debian 12 guest (debootstrap); rebuilt only when its inputs change. Tests get the
# directory of the build (the script prints it), never a path a rebuild could redirect.
guest-debian: deps
	@tests/guest/debian/build.sh $(DEBIAN_GUEST) >/dev/null

demo: deps build guest
	@scripts/demo.sh

vet:
	@echo "== make $@ at $$(date +%T)"
	$(GO) vet ./...
	$(GO) vet -tags bench ./cmd/vmfork
	$(GO) vet -tags failpoints ./...
	$(GO) vet -tags integration ./tests/...

# The guest scripts the customize package embeds (customize/scripts/*.sh),
# as POSIX sh: guests run them with busybox ash (the test guest) or dash.
# Each file's contract holds the checks it turns off, with the reason.
shellcheck: deps
	@echo "== make $@ at $$(date +%T)"
	shellcheck --shell=sh customize/scripts/*.sh

# Unit tests boot nothing and need no QEMU.
UNIT_FLAGS ?=
unit:
	@echo "== make $@ at $$(date +%T)"
	$(GO) test -race -count=1 $(UNIT_FLAGS) ./...
	$(GO) test -race -count=1 -tags failpoints $(UNIT_FLAGS) . ./sharedmem

# The Ansible collection's unit tests (python3 -m unittest), then ansible-test sanity
# and units (Debian 12's ansible-core 2.14 with Debian's checkers); no VM, no network.
ansible-unit: deps
	@echo "== make $@ at $$(date +%T)"
	@ansible/tests/unit/run.sh
	@scripts/ansible-test.sh

# Fuzz targets of every parser, each with an execution-count budget sized to
# about 4 s on a 2-core TCG host (pkg:Target:executions). A count has no
# wall-clock deadline: Go 1.26's fuzz coordinator can fail a -fuzztime
# duration at its deadline with no failing input (golang/go#75804, fixed in
# Go 1.27). The seed corpus is replayed first, as the deterministic gate.
# FUZZ_SCALE=10 for a longer hunt (the counts are multiplied by it).
FUZZ_SCALE ?= 1
FUZZ_TARGETS = .:FuzzParseMemory:20000 .:FuzzParsePortForward:20000 .:FuzzParseNetwork:10000 \
	.:FuzzValidateName:20000 .:FuzzMachineRecord:1500 ./overlay:FuzzCheckBase:300
fuzz:
	@echo "== make $@ at $$(date +%T)"
	@for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; rest=$${t#*:}; fn=$${rest%%:*}; n=$${rest#*:}; \
		$(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $$((n * $(FUZZ_SCALE)))x $$pkg || exit 1; \
	done

# The Python package (python/): installed offline the way a user does
# (pip install, no index: its build backend is the standard library), then
# its pytest suite against real guests (one busybox source, forked).
python-test: deps build guest
	@rm -rf $(CURDIR)/bin/python && /usr/bin/python3 -m pip install -q --no-index --no-compile --target $(CURDIR)/bin/python ./python
	cd python/tests && PYTHONPATH=$(CURDIR)/bin/python VMFORK_BIN=$(BIN) VMFORK_GUEST=$(GUEST_OUT) /usr/bin/python3 -m pytest -q -p no:cacheprovider .

# Integration tests boot the real test guest under real QEMU (TCG without KVM).
integration: deps build guest guest-debian
	@echo "== make $@ at $$(date +%T)"
	@scripts/libvirtd.sh
	VMFORK_BIN=$(BIN) VMFORK_BENCH_BIN=$(BENCH_BIN) VMFORK_FAILPOINTS_BIN=$(FAILPOINTS_BIN) VMFORK_GUEST=$(GUEST_OUT) VMFORK_DEBIAN_GUEST=$$(tests/guest/debian/build.sh $(DEBIAN_GUEST) 2>/dev/null) $(GO) test -tags integration -count=1 -parallel 64 -timeout 80m -v ./tests/...

# Benchmarks boot real guests; figures go to stdout (and JSON to $VMFORK_BENCH_JSON).
bench: deps build guest guest-debian
	VMFORK_BIN=$(BIN) VMFORK_GUEST=$(GUEST_OUT) VMFORK_DEBIAN_GUEST=$$(tests/guest/debian/build.sh $(DEBIAN_GUEST) 2>/dev/null) $(GO) test -tags integration -run '^$$' -bench BenchmarkFork -benchtime 8x -timeout 30m ./tests/

# Side by side (docs/BENCHMARKS.md): vmfork against the bare-QEMU floor, a
# kept template with a warm pool, libvirt save+restore, a cold boot, and vmfork's libvirt
# driver against virsh create --paused; a 100-child burst; how the cost grows
# with guest RAM and children. Tables on stdout, plots into docs/. Each takes
# minutes and loads every core. PEERS_FLAGS adds flags, e.g.
# make bench-peers PEERS_FLAGS='--guest-use 75%'.
# The libvirt driver's children need vmfork's start hook: libvirt setup is
# idempotent and says what it changed.
PEERS_FLAGS ?=
bench-peers: deps build guest
	@scripts/libvirtd.sh
	$(BIN) libvirt setup
	$(BENCH_BIN) bench peers --guest $(GUEST_OUT) --plot docs/bench-peers.svg $(PEERS_FLAGS)

# The same with every source guest holding 60% of its RAM in non-zero data, as
# a desktop or an agent's machine in use does.
bench-peers-used: deps build guest
	@scripts/libvirtd.sh
	$(BIN) libvirt setup
	$(BENCH_BIN) bench peers --guest $(GUEST_OUT) --guest-use 60% --plot docs/bench-peers-used.svg

# One burst: its plot, and each child's timeline and the CPU samples as CSV
# (docs/BENCHMARKS.md, "Burst"; several runs in one figure:
# go run ./tests/bench/burstruns). Long: not part of make test.
bench-burst: deps build guest
	$(BENCH_BIN) bench burst --guest $(GUEST_OUT) --plot docs/bench-burst.svg \
		--csv docs/bench-burst-children.csv --cpu-csv docs/bench-burst-cpu.csv

bench-scale: deps build guest
	$(BENCH_BIN) bench scale --guest $(GUEST_OUT) --plot docs/bench-scale.svg

# What a fork contract adds to a child's READY, with and without, per guest
# and network (docs/BENCHMARKS.md, "The fork contract").
bench-contract: deps build guest guest-debian
	VMFORK_BIN=$(BIN) VMFORK_GUEST=$(GUEST_OUT) VMFORK_DEBIAN_GUEST=$$(tests/guest/debian/build.sh $(DEBIAN_GUEST) 2>/dev/null) $(GO) test -tags integration -run '^$$' -bench BenchmarkContractReady -benchtime 6x -timeout 40m ./tests/

# The identity chain per step on QEMU's user network, a bridge with dnsmasq
# and an isolated libvirt network, both guests (docs/BENCHMARKS.md, "READY
# on real networks").
bench-network: deps build guest guest-debian
	VMFORK_BIN=$(BIN) VMFORK_GUEST=$(GUEST_OUT) VMFORK_DEBIAN_GUEST=$$(tests/guest/debian/build.sh $(DEBIAN_GUEST) 2>/dev/null) $(GO) test -tags integration -run '^$$' -bench BenchmarkNetworkChain -benchtime 3x -timeout 40m ./tests/

# vmfork mcp for agents: a tool call's overhead over the same CLI command,
# and 20 rounds of fork → exec → rm through MCP (pause, host memory, server RSS).
bench-mcp: deps build guest
	VMFORK_BIN=$(BIN) VMFORK_GUEST=$(GUEST_OUT) $(GO) test -tags integration -run '^$$' -bench BenchmarkMCP -benchtime 1x -timeout 30m -v ./tests/

bench-all: bench-peers bench-peers-used bench-burst bench-scale

test: deps vet shellcheck unit fuzz ansible-unit integration python-test

# The crash matrices (docs/RELIABILITY.md: TestCrashMatrix, and
# TestCrashMatrixLibvirt on libvirtd) with every case run CRASH_RUNS times
# instead of make test's once: vmfork (its failpoints build), or a QEMU,
# killed with SIGKILL at each fault point, then repaired. Tens of minutes of
# TCG guests; not part of make test. CRASH_CASES (a regexp on case names)
# runs some cases only.
CRASH_CASES ?=
CRASH_RUNS ?= 10
crash-matrix: deps build guest
	@scripts/libvirtd.sh
	VMFORK_CRASH_RUNS=$(CRASH_RUNS) VMFORK_CRASH_CASES='$(CRASH_CASES)' VMFORK_BIN=$(BIN) VMFORK_FAILPOINTS_BIN=$(FAILPOINTS_BIN) VMFORK_GUEST=$(GUEST_OUT) $(GO) test -tags integration -count=1 -timeout 60m -run 'TestCrashMatrix' -v ./tests/

clean:
	rm -rf bin $(GUEST_OUT)
