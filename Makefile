# vmfork. The two commands a newcomer needs:
#   make demo   installs what is missing, builds, and runs the demo
#   make test   installs what is missing, builds, runs unit and integration tests
export PATH := /usr/local/go/bin:$(PATH)

GUEST_OUT ?= $(CURDIR)/tests/guest/out
BIN       ?= $(CURDIR)/bin/vmfork
GO        ?= go

.PHONY: all deps build guest demo test unit integration bench vet clean

all: build

deps:
	@scripts/deps.sh

build:
	$(GO) build -o $(BIN) ./cmd/vmfork

guest: deps
	@tests/guest/build.sh $(GUEST_OUT) >/dev/null

demo: deps build guest
	@scripts/demo.sh

vet:
	$(GO) vet ./...
	$(GO) vet -tags integration ./tests/...

# Unit tests boot nothing and need no QEMU.
unit:
	$(GO) test -race -count=1 ./...

# Integration tests boot the real test guest under real QEMU (TCG without KVM).
integration: deps build guest
	@scripts/libvirtd.sh
	VMFORK_BIN=$(BIN) VMFORK_GUEST=$(GUEST_OUT) $(GO) test -tags integration -count=1 -timeout 60m -v ./tests/...

# Benchmarks boot real guests; figures go to stdout (and JSON to $VMFORK_BENCH_JSON).
bench: deps build guest
	VMFORK_BIN=$(BIN) VMFORK_GUEST=$(GUEST_OUT) $(GO) test -tags integration -run '^$$' -bench BenchmarkFork -benchtime 8x -timeout 30m ./tests/

test: deps vet unit integration

clean:
	rm -rf bin $(GUEST_OUT)
