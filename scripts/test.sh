#!/usr/bin/env bash
# `make test`, what CI runs: the build and lint, unit and in-process cluster tests with the race detector,
# process-level tests against the built binary, and a short smoke of the chaos, conformance and benchmark
# suites. It ends with each phase's wall time (docs/BENCHMARKS.md, "The test suite").
#
# After the build, the lint and the Raft package come the unit tests (in-process, under the race detector,
# UNIT_PARALLEL packages at a time, default 2), on their own: CPU-bound, they starve whatever runs beside them.
# (Three at a time was quicker on a quiet machine, but when this machine's host was slow the in-process clusters
# of three packages together starved: TLS handshakes to their own API over 10 s, elections flapping, dozens of
# tests failing in one run.) Then two lanes side
# by side, their lines prefixed: [e2e] the e2e tests (real clusters and containers, E2E_PARALLEL at a time,
# default 3; e2e/parallel_test.go says which may share the machine), and [smokes] the conformance, chaos and
# benchmark smokes (`skiff local` clusters, each in network namespaces of their own, and server processes on
# loopback ports); these mostly wait on elections, pods and failovers. The one benchmark whose real agent uses
# this machine's own network namespace takes turns with the e2e tests that do (internal/hostnetlock).
# TEST_LANES=1 runs every phase in turn. (With the unit tests beside the e2e tests, 4 packages at a time, the
# load reached 13 and in-process clusters missed their bounds: RBAC bootstrap over 60 s.)
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
export SKIFF_BIN=$PWD/bin/skiff
TEST_LANES=${TEST_LANES:-2}
UNIT_PARALLEL=${UNIT_PARALLEL:-2}
E2E_PARALLEL=${E2E_PARALLEL:-3}

# go vet runs once, in the lint phase; `go test` need not run its subset of it again in every package.
gotest=("$GO" test -count=1 -vet=off)
times=$(mktemp)
# Everything printed also goes to $log, so that the end can list what failed: CI keeps only an output's tail.
log=$(mktemp)
trap 'rm -f "$times" "$log"' EXIT
exec > >(tee -a "$log") 2>&1

phase() {
	local name=$1 start=$SECONDS rc=0
	shift
	echo "=== make test: $name: $*"
	"$@" || rc=$?
	printf '  %-18s %5d s%s\n' "$name" $((SECONDS - start)) "$([ $rc = 0 ] || echo "  FAILED (exit $rc)")" >>"$times"
	return $rc
}

unit() {
	# Every package but the Raft one (run before), the process-level e2e tests and the benchmarks; the chaos
	# package's long suites have their own phase and `make chaos`. The longest packages go first, so that the
	# last to finish is a short one.
	local pkgs mod p first=() longest=(server controller apiserver nodeagent chaos apiserver/raftstore apiserver/auth)
	pkgs=$($GO list ./... | grep -v -E '/(raftnode|e2e|bench)(/|$)')
	mod=$($GO list -m)
	for p in "${longest[@]}"; do
		first+=("./$p")
		pkgs=$(grep -v -x "$mod/$p" <<<"$pkgs")
	done
	# shellcheck disable=SC2086 # one package a word
	phase unit "${gotest[@]}" -race -p "$UNIT_PARALLEL" -timeout 20m -skip '^(TestChaos|TestFaults)$' "${first[@]}" $pkgs
}

e2e() {
	# In go test's local directory mode (no package argument) the test binary's stderr streams through, passing
	# or not: the host-network turns' lengths (internal/hostnetlock) show in every log.
	phase e2e env -C e2e "${gotest[@]}" -parallel "$E2E_PARALLEL" -timeout 30m
}

smokes() {
	# conformance/smoke.txt's tests, as `make conformance-smoke` (without its build: bin/skiff is in use).
	phase conformance-smoke env CONFORMANCE_TESTS=conformance/smoke.txt CONFORMANCE_TIMEOUT=15m conformance/run.sh || return
	# The chaos suite's smoke: four rounds, four kinds of fault.
	phase chaos-smoke "${gotest[@]}" -run '^TestChaos$' -timeout 15m ./chaos/ -args -chaos.rounds=4 \
		-chaos.plan=kill-leader,partition-leader,pause-leader,rolling-restart || return
	phase bench-smoke scripts/smoke.sh
}

# lane runs a lane in the background with its lines prefixed by its name.
lane() {
	local name=$1
	shift
	("$@" 2>&1 | sed -u "s/^/[$name] /"; exit "${PIPESTATUS[0]}") &
}

rc=0
{
	phase build make --no-print-directory build &&
		phase lint make --no-print-directory lint &&
		# The Raft tests run on their own: their in-process clusters use leases of 100 ms, which a package
		# competing for the two cores under the race detector made lapse.
		phase raftnode "${gotest[@]}" -race -timeout 15m -skip '^(TestChaos|TestFaults)$' ./raftnode/...
} || rc=1
if [ $rc = 0 ]; then
	unit || rc=1
fi
if [ $rc = 0 ] && [ "$TEST_LANES" = 1 ]; then
	smokes && e2e || rc=1
elif [ $rc = 0 ]; then
	lane e2e e2e
	e2e_pid=$!
	lane smokes smokes
	smokes_pid=$!
	wait $e2e_pid || rc=1
	wait $smokes_pid || rc=1
fi
if [ $rc != 0 ]; then
	echo "=== make test: what failed"
	# Each failed test with the last lines it logged itself (its t.Fatal among them), not the servers' logs
	# that servertest forwards (timestamped): CI keeps only the tail, and the reason must be in it.
	awk '
		function flush() { for (i = n > 6 ? n - 5 : 1; i <= n; i++) print buf[i]; n = 0; failed = 0 }
		/--- FAIL:|\[FAIL\]|^(\[[a-z]+\] )?(FAIL|panic:|fatal error:)/ && !/^(\[[a-z]+\] )?FAIL$/ {
			flush(); print; failed = /--- FAIL:/; next
		}
		/--- (PASS|SKIP):|=== RUN|^(\[[a-z]+\] )?(ok|FAIL)[ \t]/ { flush() }
		failed && /[A-Za-z0-9_]+\.go:[0-9]+: / && !/\.go:[0-9]+: [0-9-]+T[0-9:.]+Z / { buf[++n] = substr($0, 1, 400) }
		END { flush() }
	' "$log" | head -80 || true
fi
echo "=== make test: phase wall times"
cat "$times"
printf '  %-18s %5d s\n' total "$SECONDS"
[ $rc = 0 ] && echo "=== make test: ok" || echo "=== make test: FAILED"
exit $rc
