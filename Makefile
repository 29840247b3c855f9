# Skiff build, test and benchmark entry points. `make test` is what CI runs (through .ci/run).
GO        ?= go
BIN       := bin/skiff
# The release version the binary says (skiff version, the version skew check); a tree without a release tag
# builds a commit name, which the skew policy does not check.
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
PKGS      := ./...
export PATH := $(PATH):/usr/local/go/bin

.PHONY: all setup build lint test unit e2e smoke bench bench-scale chaos conformance conformance-smoke dev up down clean

all: build

setup:
	@scripts/setup.sh

# bin/skiff-pause is the pod sandbox's pause process; agents build their pause image from it.
# bin/skiff-container-io is a container's stdio process; the agent runs one per container, from beside skiff.
build:
	$(GO) build -ldflags "-X github.com/skiff-dev/skiff/internal/version.Version=$(VERSION)" -o $(BIN) ./cmd/skiff
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o bin/skiff-pause ./cmd/skiff-pause
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o bin/skiff-container-io ./cmd/skiff-container-io

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

# The full test suite (scripts/test.sh): build and lint, unit and cluster tests with the race detector,
# process-level tests against the built binary, and a short smoke of the chaos, conformance and benchmark
# suites; it ends with each phase's wall time.
test: setup
	scripts/test.sh

# A short run of every benchmark (scripts/smoke.sh), part of `make test`.
smoke: build
	scripts/smoke.sh

# Full benchmarks; docs/BENCHMARKS.md records their figures and these commands.
bench: setup build
	$(GO) test -count=1 -run '^$$' -bench . -benchmem -timeout 30m ./fsm/
	SKIFF_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -run '^$$' -bench 'Write' -benchtime 20000x -timeout 30m ./bench/
	SKIFF_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -run '^$$' -bench 'Failover' -benchtime 20x -timeout 30m ./bench/
	SKIFF_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -run '^$$' -bench 'API' -benchtime 10000x -timeout 30m ./bench/
	SKIFF_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -run '^$$' -bench '^BenchmarkCreates$$' -benchtime 5000x -timeout 30m ./bench/
	SKIFF_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -run '^$$' -bench 'Admission' -benchtime 4000x -timeout 30m ./bench/
	SKIFF_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -run '^$$' -bench 'CacheLag' -benchtime 1000x -timeout 30m ./bench/
	SKIFF_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -run '^$$' -bench 'CRDs' -benchtime 5000x -timeout 60m ./bench/ -args -crd.kube-apiserver
	SKIFF_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -run '^$$' -bench 'Scheduler' -benchtime 1x -timeout 30m ./bench/
	$(GO) test -count=1 -run '^$$' -bench 'CacheMemory|Decide' -timeout 30m ./scheduler/
	SKIFF_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -run '^$$' -bench 'PodStartup' -benchtime 1x -timeout 30m ./bench/
	SKIFF_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -run '^$$' -bench 'Workloads' -benchtime 1x -timeout 30m ./bench/
	SKIFF_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -run '^$$' -bench 'NodeDetection' -benchtime 1x -timeout 30m ./bench/
	$(GO) test -count=1 -run '^$$' -bench 'GossipConvergence' -benchtime 10x -timeout 30m ./gossip/
	$(GO) test -count=1 -run '^$$' -bench 'BuildRules|Sync|RestoreOnly' -benchtime 3x -timeout 30m ./nodeagent/proxy/
	$(GO) test -count=1 -run '^$$' -bench 'Build|PolicySync' -benchtime 100x -timeout 30m ./nodeagent/netpol/
	SKIFF_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -run '^$$' -bench 'NetworkProgramming|ClusterDNS' -benchtime 1x -timeout 30m ./bench/
	SKIFF_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -run '^$$' -bench 'PolicyProgramming' -benchtime 50x -timeout 30m ./bench/
	SKIFF_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -run '^$$' -bench '^Benchmark(Exec|LogsFollow|PortForward)$$' -benchtime 1x -timeout 30m ./bench/
	SKIFF_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -run '^$$' -bench '^BenchmarkScale$$' -benchtime 1x -timeout 60m ./bench/ -args -scale.steps=500 -scale.pods-per-node=10

# The scale benchmark at the steps of Kubernetes' largest supported cluster (docs/BENCHMARKS.md): 500 to 5,000
# simulated nodes at 30 pods per node, a fresh cluster per step; SCALE_STEPS narrows it. Hours, not in make bench.
SCALE_STEPS ?= 500,1000,2000,5000
bench-scale: setup build
	SKIFF_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -run '^$$' -bench '^BenchmarkScale$$' -benchtime 1x -timeout 12h ./bench/ -args -scale.steps=$(SCALE_STEPS) -scale.report=$(CURDIR)/bench-scale.md

# `make chaos`: every fault, at least 100 leader kills, 50 partitions, 20 pauses, 20 interrupted transfers,
# 10 snapshot installs and 5 full crashes, two faults a round where they may share one; the run lasts until the
# plan is used up (about 130 rounds, 50 minutes). CHAOS_SEED=N replays a run.
CHAOS_PLAN := kill-leader=100,partition-leader=15,partition-minority=15,partition-agents=10,partition-oneway=10,pause-leader=20,interrupted-transfer=20,snapshot-install=10,full-crash=5,netem=5,disk-full=3,kill-server=5,kill-agent=5,rolling-restart=5
CHAOS_SEED ?= 0

# Longer fault suites: the process-level chaos suite, each fault injected and healed on its own, the
# in-process Raft chaos test, and many randomized bootstrap start orders.
chaos: setup build
	$(GO) test -race -count=1 -run 'TestChaos' -timeout 30m ./raftnode/ -args -chaos.rounds=60
	$(GO) test -count=1 -run 'TestBootstrapRandomStartOrders' -timeout 30m ./server/ -args -bootstrap.trials=40
	SKIFF_BIN=$(CURDIR)/$(BIN) $(GO) test -count=2 -timeout 40m ./e2e/...
	SKIFF_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -run '^TestFaults$$' -timeout 1h ./chaos/
	rm -rf .chaos && mkdir -p .chaos && SKIFF_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -run '^TestChaos$$' -timeout 3h ./chaos/ -args -chaos.rounds=0 -chaos.faults-per-round=2 -chaos.plan=$(CHAOS_PLAN) -chaos.seed=$(CHAOS_SEED) -chaos.report-dir=$(CURDIR)/.chaos; status=$$?; cat .chaos/report.txt; exit $$status

# The Kubernetes v1.37.2 conformance suite against a local cluster of 3 servers and 2 agents, every image built
# here; docs/CONFORMANCE.md. CONFORMANCE_FOCUS=regexp narrows it, CONFORMANCE_KEEP=1 leaves the cluster up.
conformance: setup build
	conformance/run.sh

# The conformance smoke `make test` runs: the tests of conformance/smoke.txt, a few from each SIG.
conformance-smoke: build
	CONFORMANCE_TESTS=conformance/smoke.txt CONFORMANCE_TIMEOUT=15m conformance/run.sh

# A local HA cluster: three servers and two node agents, each in its own network namespace on this machine.
# `make down` removes it (processes, pods, namespaces, the bridge) and its .skiff directory.
up: setup build
	$(BIN) local up --servers 3 --agents 2 --dir .skiff

down:
	$(BIN) local down --dir .skiff

# A single-server cluster in the foreground (Ctrl-C stops it and removes its temporary data).
dev: setup build
	$(BIN) dev

clean:
	rm -rf bin

# The release build: no file paths of this machine (-trimpath), no symbol table or DWARF (-s -w), the version
# stamped. no_dynamic_plugins is containerd's tag that drops its Go plugin loader (and so the standard library's
# plugin package, which makes the linker export every symbol as a dynamic one); Skiff loads no containerd
# plugins. docs/BENCHMARKS.md has the sizes.
RELEASE_DIR   := bin/release
RELEASE_TAGS  := no_dynamic_plugins
RELEASE_FLAGS := -trimpath -tags '$(RELEASE_TAGS)' -ldflags "-s -w -X github.com/skiff-dev/skiff/internal/version.Version=$(VERSION)"
# Debian versions start with a digit: v1.2.3 is 1.2.3, v1.2.3-rc.1 1.2.3~rc.1 (before 1.2.3), v1.2.3-4-gabc
# (a commit after the tag) 1.2.3+4.gabc, and a tree without a tag 0.0.0~git<commit name>.
DEB_VERSION   ?= $(shell echo '$(VERSION)' | sed -E -e 's/^v([0-9])/\1/' -e 's/-([0-9]+)-g([0-9a-f]+)/+\1.g\2/' -e '/^[0-9]+\./!s/^/0.0.0~git/' -e 's/[^A-Za-z0-9.+~]/~/g')
DEB           := bin/skiff_$(DEB_VERSION)_amd64.deb

.PHONY: release package package-test

release:
	$(GO) build $(RELEASE_FLAGS) -o $(RELEASE_DIR)/skiff ./cmd/skiff
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $(RELEASE_DIR)/skiff-pause ./cmd/skiff-pause
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o $(RELEASE_DIR)/skiff-container-io ./cmd/skiff-container-io
	@ls -l $(RELEASE_DIR)/skiff $(RELEASE_DIR)/skiff-pause $(RELEASE_DIR)/skiff-container-io
	@$(RELEASE_DIR)/skiff version

# The Debian package of the release build: packaging/nfpm.yaml, built by nfpm, a tool of packaging/go.mod's
# own module (so that the main module does not depend on it).
package: release
	cd packaging && $(GO) build -o ../bin/nfpm github.com/goreleaser/nfpm/v2/cmd/nfpm
	SKIFF_DEB_VERSION='$(DEB_VERSION)' SKIFF_RELEASE_DIR='$(RELEASE_DIR)' bin/nfpm package --config packaging/nfpm.yaml --packager deb --target $(DEB)
	@ls -l $(DEB)

# Installs the package into a fresh Debian chroot (mmdebstrap), checks its contents and units, starts a server
# and an agent from the units' command lines, purges it and checks nothing is left; packaging/test.sh.
package-test: package
	packaging/test.sh $(DEB)
