#!/usr/bin/env bash
# packaging/test.sh DEB: the Debian package's acceptance test (make package-test). Run as root.
#
#  1. dpkg-deb --info and --contents: the files, modes, conffiles, maintainer scripts and dependencies.
#  2. A fresh Debian chroot (mmdebstrap, minbase plus systemd, curl and the package's dependencies), in a network
#     namespace, a mount namespace and a PID namespace of its own, so nothing it does reaches this machine.
#  3. dpkg -i; systemd-analyze verify on both units; the skiff user and the directories.
#  4. A server and an agent started from the units' ExecStart lines (as the units' users) with the shipped
#     /etc/skiff examples, the agent's only edit being its join token; the server's /readyz, the Node Ready,
#     a pod Running.
#  5. An upgrade to the same package as a newer version: the edited conffile kept, the pod's container running
#     through it and not restarted once both are started again.
#  6. Both stopped as systemd would (SIGTERM; the agent's unit has KillMode=process, so the pod's processes and
#     the node's DNS process stay), then dpkg --purge; nothing left: files, the user, iptables rules, mounts, network
#     namespaces, the bridge, processes.
# Everything it makes (the chroot, the namespaces) goes when it ends, failed or not.
#
# SKIFF_PKGTEST_SUITE (bookworm) is the Debian release; SKIFF_PKGTEST_BASE=FILE keeps the chroot's tarball
# there and reuses it when it exists (the package's dependencies must not change in between).
set -euo pipefail

deb=$(realpath "${1:?usage: packaging/test.sh skiff_VERSION_amd64.deb}")
suite=${SKIFF_PKGTEST_SUITE:-bookworm}
[ "$(id -u)" = 0 ] || { echo "package-test: run as root" >&2; exit 1; }
if ! command -v mmdebstrap >/dev/null; then
	echo "package-test: installing mmdebstrap"
	apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null
fi
for tool in dpkg-deb mmdebstrap ip unshare nsenter; do
	command -v "$tool" >/dev/null || { echo "package-test: $tool is missing" >&2; exit 1; }
done

work=$(mktemp -d /var/tmp/skiff-pkgtest.XXXXXX)
root=$work/root
ns=skiff-pkgtest-$$
inner=
cleanup() {
	status=$?
	# The PID namespace's init is the unshare's child: ending it ends every process of the test.
	if [ -n "$inner" ]; then kill -KILL "$inner" 2>/dev/null || true; wait "$inner" 2>/dev/null || true; fi
	ip netns del "$ns" 2>/dev/null || true
	# The chroot's mounts were made in the test's own mount namespace; none should be here. Make sure.
	if grep -q " $root" /proc/self/mounts; then
		grep " $root" /proc/self/mounts | awk '{print $2}' | sort -r | xargs -r -n1 umount -l || true
	fi
	rm -rf "$work"
	if [ "$status" = 0 ]; then echo "package-test: PASS"; else echo "package-test: FAIL" >&2; fi
	exit "$status"
}
trap cleanup EXIT
fail() { echo "package-test: $*" >&2; exit 1; }

echo "== dpkg-deb --info"
dpkg-deb --info "$deb"
echo "== dpkg-deb --contents"
dpkg-deb --contents "$deb" | tee "$work/contents"
for path in ./usr/bin/skiff ./usr/bin/skiff-pause ./usr/bin/skiff-container-io ./lib/systemd/system/skiff-server.service \
	./lib/systemd/system/skiff-agent.service ./etc/skiff/server.hcl ./etc/skiff/agent.hcl; do
	grep -q " $path\$" "$work/contents" || fail "$path is not in the package"
done
dpkg-deb --ctrl-tarfile "$deb" | tar -x -O ./conffiles >"$work/conffiles"
for path in /etc/skiff/server.hcl /etc/skiff/agent.hcl; do
	grep -qx "$path" "$work/conffiles" || fail "$path is not a conffile"
done
deps=$(dpkg-deb -f "$deb" Depends | sed -e 's/([^)]*)//g' -e 's/[[:space:]]//g')

echo "== a $suite chroot with $deps"
if [ -n "${SKIFF_PKGTEST_BASE:-}" ] && [ -f "$SKIFF_PKGTEST_BASE" ]; then
	mkdir "$root" && tar -C "$root" -xf "$SKIFF_PKGTEST_BASE"
else
	mmdebstrap --quiet --variant=minbase --include="systemd,curl,ca-certificates,$deps" "$suite" "$work/base.tar"
	mkdir "$root" && tar -C "$root" -xf "$work/base.tar"
	if [ -n "${SKIFF_PKGTEST_BASE:-}" ]; then cp "$work/base.tar" "$SKIFF_PKGTEST_BASE"; fi
	rm -f "$work/base.tar"
fi
cp "$deb" "$root/tmp/skiff.deb"
cp "$(dirname "$0")/test-inside.sh" "$root/tmp/test-inside.sh"
# The same package as a newer version, for the upgrade.
dpkg-deb -R "$deb" "$work/upgrade"
sed -i "s/^Version: .*/&+pkgtest1/" "$work/upgrade/DEBIAN/control"
dpkg-deb -Znone -b "$work/upgrade" "$root/tmp/skiff-upgrade.deb" >/dev/null
rm -rf "$work/upgrade"

ip netns add "$ns"
# A PID namespace whose init is the chroot's script (its end kills whatever is left), a private mount
# namespace for /proc, /sys, /dev, /run and the agent's own mounts, the network namespace for addresses,
# routes, the bridge and iptables.
# (nsenter, not ip netns exec, which mounts a /sys of its own and so hides the cgroup hierarchies runc needs.)
nsenter --net="/run/netns/$ns" unshare --mount --propagation private --pid --fork --kill-child bash -c '
	set -e
	root=$1
	# runc makes / of the mount namespace a slave: in a chroot / must be a mount point.
	mount --bind "$root" "$root"
	mount -t proc proc "$root/proc"
	mount -t sysfs sysfs "$root/sys"
	mount --rbind /sys/fs/cgroup "$root/sys/fs/cgroup"
	mount --rbind /dev "$root/dev"
	mount -t tmpfs -o mode=0755 tmpfs "$root/run"
	exec chroot "$root" /bin/bash /tmp/test-inside.sh
' test-chroot "$root" &
inner=$!
wait "$inner"
inner=
