#!/usr/bin/env bash
# Installs what Skiff needs on a fresh Debian machine, when it is missing. Run as root. Safe to run again.
set -euo pipefail

# Debian packages: the container runtime, networking and registry pieces the node agent and its tests use,
# and etcd-server, which the benchmarks run beside Skiff for comparison.
# bind9-dnsutils, netcat-openbsd and nginx-light go into the conformance suite's images (conformance/images);
# gcc, make, libc6-dev and bzip2 build its busybox from the release's source (conformance/run.sh).
packages=(containerd runc iptables conntrack ipset containernetworking-plugins busybox-static docker-registry etcd-server iproute2 curl ca-certificates
  bind9-dnsutils netcat-openbsd nginx-light gcc make libc6-dev bzip2)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Package scripts must not start daemons here: the project starts its own containerd and etcd when needed.
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  export PATH=$PATH:/usr/local/go/bin
fi
command -v go >/dev/null 2>&1 || { echo "setup: Go is required (https://go.dev/dl/); Skiff builds with Go 1.26" >&2; exit 1; }
