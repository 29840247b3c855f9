#!/usr/bin/env bash
# `make conformance`: the Kubernetes v1.37.2 conformance suite against `skiff local` (3 servers, 2 agents).
#
# It builds e2e.test, the ginkgo CLI, a kubectl that says v1.37.2, and every image the suite runs (see
# conformance/images) from the module graph in go.mod, starts a local cluster whose agents import the images,
# runs the parallel part and then the [Serial] part, and leaves in $CONFORMANCE_DIR/results a sonobuoy-style
# e2e.log and junit_01.xml. It prints "N passed, M failed" and exits non-zero if a test failed.
#
#   CONFORMANCE_FOCUS   a regular expression narrowing the tests by name (default: all of them)
#   CONFORMANCE_LABELS  the ginkgo label filter of the tests to run (default Conformance; '' for any test, as
#                       for the network policy suite: CONFORMANCE_LABELS='' CONFORMANCE_FOCUS='Feature:NetworkPolicy')
#   CONFORMANCE_TESTS   a file of test names, one per line (# comments), to run instead (conformance/smoke.txt)
#   CONFORMANCE_TIMEOUT how long each part may run (default 4h)
#   CONFORMANCE_SKIP    a regular expression of tests to leave out (default: none)
#   CONFORMANCE_NODES   parallel ginkgo processes for the parallel part (default 4)
#   CONFORMANCE_DIR     where builds, the cluster and results go (default .conformance)
#   CONFORMANCE_KILL_LEADER=N  kills the Raft leader (kill -9) N seconds into the parallel part and starts it again
#                       10 s later: the suite must pass across a leader failover too
#   CONFORMANCE_KEEP=1  leaves the cluster up afterwards (`bin/skiff local down --dir $CONFORMANCE_DIR/cluster`)
#
# The suite's programs are cached between runs (SKIFF_CACHE, default ~/.cache/skiff); Skiff's own are rebuilt.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
dir=$(realpath -m "${CONFORMANCE_DIR:-.conformance}")
focus=${CONFORMANCE_FOCUS:-.}
skip=${CONFORMANCE_SKIP:-}
nodes=${CONFORMANCE_NODES:-4}
timeout=${CONFORMANCE_TIMEOUT:-4h}
labels=${CONFORMANCE_LABELS-Conformance}
if [ -n "${CONFORMANCE_TESTS:-}" ]; then
	# Each name is matched literally: regular expression characters are escaped.
	focus=$(grep -v '^#' "$CONFORMANCE_TESTS" | grep -v '^$' | sed 's/[][().*+?^$|{}\\]/\\&/g' | paste -sd'|')
fi
kube=v1.37.2
bin=$dir/bin
results=$dir/results
GO=${GO:-go}

log() { printf '%s conformance: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

mkdir -p "$bin"
kmod=$($GO list -m -f '{{.Dir}}' k8s.io/kubernetes)
stamp="-X k8s.io/component-base/version.gitVersion=$kube -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37 -X k8s.io/component-base/version.gitTreeState=clean"
# The suite's programs come from the module graph alone, so they are kept between runs and clones in a cache
# keyed by go.mod, go.sum, the Go version and the build commands below (this script): in a fresh clone Go
# links them again, which took about 2 minutes of each CI run.
key=$(cat go.mod go.sum "$root/conformance/run.sh" | { cat; $GO version; } | sha256sum | cut -c1-16)
cache=${SKIFF_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/skiff}/conformance/$key
programs=(e2e.test ginkgo kubectl agnhost sample-apiserver nnp busybox alpine.tar.gz)
# busybox as upstream's busybox image has it: release 1.37.0 built with its defconfig, statically, from the
# source tarball Debian's archive keeps (checked against the digest Debian's busybox_1.37.0-6.dsc gives).
# Debian's own busybox-static (1.35) has an ash that drops environment variables whose names are not shell
# identifiers, which four env tests pass through `sh -c env`; the release's ash passes them on.
busybox_version=1.37.0
busybox_sha256=3311dff32e746499f4df0d5df04d7eb396382d7e108bb9250e7b519b837043a4
build_busybox() { # build_busybox OUT
	local work tarball=busybox_$busybox_version.orig.tar.bz2
	work=$(mktemp -d)
	curl -fsSL -o "$work/$tarball" "http://deb.debian.org/debian/pool/main/b/busybox/$tarball"
	echo "$busybox_sha256  $work/$tarball" | sha256sum -c --quiet
	tar -xjf "$work/$tarball" -C "$work"
	(
		cd "$work/busybox-$busybox_version"
		make defconfig >/dev/null
		# Static, as the image has no libc; tc does not build against this kernel's headers (CBQ is gone).
		sed -i 's/^# CONFIG_STATIC is not set/CONFIG_STATIC=y/; s/^CONFIG_TC=y/# CONFIG_TC is not set/' .config
		make -j"$(nproc)" >/dev/null 2>&1 || make
	)
	cp "$work/busybox-$busybox_version/busybox" "$1"
	rm -rf "$work"
}
# agnhost's base, as upstream's image has it, is Alpine Linux (the ImageVolume test reads it back): Alpine's
# official minirootfs, from the repository Docker's alpine image is built from (alpinelinux/docker-alpine),
# which the Go module proxy serves, at a pinned version whose module hash the checksum database vouches for,
# and checked against the digest the repository's checksums.sha512 gives. Alpine's own mirrors are out of this
# machine's reach; the proxy had this snapshot (edge, 2026-08-05) when it was pinned.
alpine_module=github.com/alpinelinux/docker-alpine@v0.0.0-20260806101352-410e6fcf56b6
alpine_rootfs=x86_64/alpine-minirootfs-20260805-x86_64.tar.gz
alpine_sha512=1f9e4665146396bf5c9d17e73708256f7eac1de67adab2240e95ee39281317c1e05d20738e778fbbbd4abdccd22be3ed203b91577082101288beeb5c36804f5f
fetch_alpine() { # fetch_alpine OUT
	local work moddir
	work=$(mktemp -d)
	moddir=$(cd "$work" && $GO mod init fetch >/dev/null 2>&1 && $GO mod download -json "$alpine_module" |
		sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	rm -rf "$work"
	if [ -z "$moddir" ]; then
		log "cannot fetch $alpine_module through the Go module proxy (agnhost's Alpine base)"
		return 1
	fi
	echo "$alpine_sha512  $moddir/$alpine_rootfs" | sha512sum -c --quiet
	cp "$moddir/$alpine_rootfs" "$1"
}
if [ -f "$cache/complete" ]; then
	log "e2e.test, ginkgo, kubectl $kube, agnhost, sample-apiserver, nonewprivs, busybox and Alpine from $cache"
else
	log "building e2e.test, ginkgo, kubectl $kube, agnhost, sample-apiserver, nonewprivs and busybox $busybox_version; fetching Alpine"
	rm -rf "$cache" && mkdir -p "$cache"
	$GO test -c -ldflags "$stamp" -o "$cache/e2e.test" k8s.io/kubernetes/test/e2e
	$GO build -o "$cache/ginkgo" github.com/onsi/ginkgo/v2/ginkgo
	$GO build -ldflags "$stamp" -o "$cache/kubectl" k8s.io/kubernetes/cmd/kubectl
	CGO_ENABLED=0 $GO build -trimpath -ldflags '-s -w' -o "$cache/agnhost" k8s.io/kubernetes/test/images/agnhost
	CGO_ENABLED=0 $GO build -trimpath -ldflags "-s -w $stamp" -o "$cache/sample-apiserver" k8s.io/sample-apiserver
	CGO_ENABLED=0 $GO build -trimpath -ldflags '-s -w' -o "$cache/nnp" k8s.io/kubernetes/test/images/nonewprivs
	build_busybox "$cache/busybox"
	fetch_alpine "$cache/alpine.tar.gz"
	touch "$cache/complete"
	# Other keys' builds are of no further use once they are old (a recent one may be another checkout's, in use).
	find "$(dirname "$cache")" -mindepth 1 -maxdepth 1 -not -name "$key" -mmin +120 -exec rm -rf {} +
fi
for p in "${programs[@]}"; do
	cp "$cache/$p" "$bin/$p"
done
CGO_ENABLED=0 $GO build -trimpath -ldflags '-s -w' -o "$bin/pause" ./cmd/skiff-pause
$GO build -o "$bin/report" ./conformance/report

log "building the suite's images"
rm -rf "$dir/images"
$GO run ./conformance/images -out "$dir/images" -agnhost "$bin/agnhost" -sample-apiserver "$bin/sample-apiserver" \
	-pause "$bin/pause" -nonewprivs "$bin/nnp" -busybox "$bin/busybox" -alpine "$bin/alpine.tar.gz" -test-images "$kmod/test/images" >/dev/null

cluster=$dir/cluster
"$root/bin/skiff" local down --dir "$cluster" >/dev/null 2>&1 || true
# The suite's temporary files (kubectl's kuberc directories and the like, which it leaves behind) go to a
# directory of the run's own, removed at the end, not to the machine's /tmp.
suite_tmp=$dir/tmp
rm -rf "$suite_tmp" && mkdir -p "$suite_tmp"
cleanup() {
	rm -rf "$suite_tmp"
	if [ "${CONFORMANCE_KEEP:-}" = 1 ]; then
		log "the cluster stays up: KUBECONFIG=$cluster/kubeconfig; bin/skiff local down --dir $cluster removes it"
	else
		"$root/bin/skiff" local down --dir "$cluster" >/dev/null 2>&1 || true
	fi
}
trap cleanup EXIT
log "starting skiff local: 3 servers, 2 agents"
# client-go's cache mutation detector in every server and agent: an informer's objects are shared with the
# server's watch cache (memshare.Registry), so a controller that changed one would change what the API
# serves. A changed object panics its process with "cache ... modified"; the end of the run looks for it.
export KUBE_CACHE_MUTATION_DETECTOR=${KUBE_CACHE_MUTATION_DETECTOR:-true}
"$root/bin/skiff" local up --servers 3 --agents 2 --dir "$cluster" --images "$dir/images" >/dev/null
export KUBECONFIG=$cluster/kubeconfig
for _ in $(seq 120); do
	ready=$("$bin/kubectl" get nodes --no-headers 2>/dev/null | awk '$2 == "Ready"' | wc -l)
	[ "$ready" -ge 2 ] && break
	sleep 1
done
"$bin/kubectl" get nodes

rm -rf "$results" && mkdir -p "$results/parallel" "$results/serial"
e2e_args=(--kubeconfig="$KUBECONFIG" --provider=skeleton --kubectl-path="$bin/kubectl" --dns-domain=cluster.local)
run() { # run NAME LABEL-FILTER GINKGO-FLAGS...
	local name=$1 filter=$2
	shift 2
	log "running the $name part"
	local args=(--no-color --timeout="$timeout" --label-filter="$filter" --focus="$focus" "$@")
	[ -n "$skip" ] && args+=(--skip="$skip")
	TMPDIR=$suite_tmp "$bin/ginkgo" "${args[@]}" "$bin/e2e.test" -- "${e2e_args[@]}" --report-dir="$results/$name" || true
}
start=$(date +%s)
exec 3>&2
{
	killer=
	if [ -n "${CONFORMANCE_KILL_LEADER:-}" ]; then
		(
			sleep "$CONFORMANCE_KILL_LEADER"
			leader_of() { "$root/bin/skiff" local status --dir "$cluster" | sed -n 's/^leader: \([^ ]*\).*/\1/p'; }
			leader=$(leader_of)
			# The suite talks to one server (its kubeconfig's current context), as a client without a load
			# balancer does: killing that one fails every request in flight whatever the cluster does. So when
			# it leads, the leadership moves first and the new leader is killed.
			suite_server=$("$bin/kubectl" config current-context)
			if [ -n "$leader" ] && [ "$leader" = "$suite_server" ]; then
				log "the leader, $leader, is the server the suite talks to: moving the leadership away first"
				"$root/bin/skiff" operator raft transfer-leadership >&3 2>&3 || true
				for _ in $(seq 50); do
					leader=$(leader_of)
					[ -n "$leader" ] && [ "$leader" != "$suite_server" ] && break
					sleep 0.2
				done
			fi
			log "killing the leader, ${leader:-none found}"
			[ -n "$leader" ] || exit 0
			"$root/bin/skiff" local kill --dir "$cluster" "$leader"
			sleep 10
			"$root/bin/skiff" local start --dir "$cluster" "$leader"
			log "$leader started again"
		) >&3 2>&3 & # not into the pipe to tee: its sleep would hold the pipe open after the part ends
		killer=$!
	fi
	run parallel "${labels:+($labels) && }!Serial" --procs="$nodes"
	if [ -n "$killer" ]; then
		kill "$killer" 2>/dev/null || true # the part ended before the kill was due
		wait "$killer" 2>/dev/null || true
	fi
	run serial "${labels:+($labels) && }Serial"
} 2>&1 | tee "$results/e2e.log"
wall=$(( $(date +%s) - start ))
log "wall time: $((wall / 60)) min $((wall % 60)) s"
reports=()
for r in "$results"/parallel/junit_01.xml "$results"/serial/junit_01.xml; do
	[ -f "$r" ] && reports+=("$r")
done
"$bin/report" -out "$results/junit_01.xml" "${reports[@]}" | tee "$results/summary.txt"
if grep -l 'ALTERED!' "$cluster"/*.log >/dev/null 2>&1; then
	log "an informer's cached object was changed (client-go's cache mutation detector): $(grep -l 'ALTERED!' "$cluster"/*.log | xargs)"
	exit 1
fi
