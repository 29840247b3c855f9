#!/usr/bin/env bash
# `make smoke`: a short run of every benchmark, to show that each still works (the figures of record come from
# `make bench`; docs/BENCHMARKS.md). Each package's test binary is built once and run once per row, instead of
# a `go test` per row that links the binary again (about 20 s each on two cores). PodStartup comes last: its
# agent uses this machine's own network namespace and waits its turn with the e2e tests' that do
# (internal/hostnetlock), which in make test run beside this smoke; the other rows need not wait behind it.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
GO=${GO:-go}
export SKIFF_BIN=${SKIFF_BIN:-$root/bin/skiff}
out=$root/bin/test
mkdir -p "$out"

# package, benchmarks (a regular expression without spaces), -benchtime, then the benchmark's own flags
table=$(cat <<'ROWS'
bench            Write                                      300x
bench            Failover                                   2x
bench            API                                        200x  -api.list-pods=300 -api.watchers=30
bench            ^BenchmarkCreates$                         100x  -creates.rounds=1 -creates.kube-apiserver=false
bench            Admission                                  200x
bench            CacheLag                                   100x
bench            CRDs                                       200x  -crd.count=5
bench            Scheduler                                  1x    -sched.nodes=200 -sched.pods=300 -sched.affinity-pods=100
scheduler        CacheMemory                                1x    -mem.nodes=500 -mem.pods=5000
bench            Workloads                                  1x    -workloads.job-completions=50 -workloads.statefulset-replicas=10 -workloads.nodes=5
bench            ^BenchmarkScale$                           1x    -scale.steps=20 -scale.pods-per-node=5 -scale.nodes-per-member=10 -scale.idle=5s -scale.latency-pods=20 -scale.systems=skiff
bench            NodeDetection                              1x    -detect.trials=1 -detect.nodes=50 -detect.cpu-sample=2s
gossip           GossipConvergence                          1x    -gossip.members=10
nodeagent/proxy  BuildRules|Sync|RestoreOnly                1x    -proxy.services=100
nodeagent/netpol Build|PolicySync                          5x    -netpol.policies=100 -netpol.pods=500
bench            NetworkProgramming|ClusterDNS              1x    -netprog.pods=6 -dns.queries=2000
bench            PolicyProgramming                          2x    -netpol.policies=20 -netpol.pods=100
bench            ^Benchmark(Exec|LogsFollow|PortForward)$   1x    -exec.runs=5 -logs.seconds=2 -pf.mib=16 -pf.runs=1
bench            PodStartup                                 1x    -startup.pods=5
ROWS
)

for pkg in $(awk '{print $1}' <<<"$table" | sort -u); do
	$GO test -c -o "$out/$(tr / - <<<"$pkg").test" "./$pkg"
done
while read -r -u 3 pkg bench benchtime args; do
	start=$(date +%s)
	# A test binary runs in its package's directory, as `go test` runs it.
	# shellcheck disable=SC2086 # the flags are words
	(cd "$pkg" && "$out/$(tr / - <<<"$pkg").test" -test.count=1 -test.run '^$' -test.bench "$bench" \
		-test.benchtime "$benchtime" -test.timeout 10m $args)
	echo "smoke: $pkg $bench: $(($(date +%s) - start)) s"
done 3<<<"$table"
