#!/bin/bash
# The part of packaging/test.sh that runs inside the test's chroot, as the init of its PID namespace (so
# whatever it leaves running ends with it). See test.sh.
set -euo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
fail() {
	echo "package-test: $*" >&2
	[ -f /tmp/pod.json ] && { echo "--- the pod" >&2; head -c 4000 /tmp/pod.json >&2; echo >&2; }
	[ -f /var/lib/skiff/agent/containerd/containerd.log ] && { echo "--- containerd" >&2; tail -n 20 /var/lib/skiff/agent/containerd/containerd.log >&2; }
	for f in /tmp/server.log /tmp/agent.log; do
		[ -f "$f" ] && { echo "--- last lines of $f" >&2; tail -n 40 "$f" >&2; }
	done
	exit 1
}
# waitfor SECONDS WHAT COMMAND...: polls COMMAND every second until it succeeds.
waitfor() {
	local deadline=$((SECONDS + $1)) what=$2
	shift 2
	until "$@" >/dev/null 2>&1; do
		[ "$SECONDS" -lt "$deadline" ] || fail "$what: not within the time allowed"
		sleep 1
	done
	echo "ok: $what (after ${SECONDS}s of the test)"
}
# unitline UNIT KEY: a key's value in an installed unit (the last one, as systemd takes it).
unitline() { sed -n "s/^$2=//p" "/lib/systemd/system/$1" | tail -n 1; }

ip link set lo up
# Files before the package, to compare with what a purge leaves.
snapshot() {
	{
		find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /run -o -path /tmp -o -path /var/cache/apt \
			-o -path /var/lib/dpkg -o -path /var/log/dpkg.log \) -prune -o -print
		find /run -xdev -path /run/systemd -prune -o -print   # /run/systemd: systemd-analyze's own
	} | sort
}
snapshot >/tmp/files-before
mountpoints() { awk '{print $5}' /proc/self/mountinfo | sort; }
mountpoints >/tmp/mounts-before

echo "== dpkg -i"
# Package scripts of the dependencies must not start daemons (mmdebstrap installed them already; this is
# only for the record).
dpkg -i /tmp/skiff.deb
dpkg -s skiff | grep -E '^(Status|Version):'
skiff version

echo "== systemd-analyze verify"
systemd-analyze verify /lib/systemd/system/skiff-server.service /lib/systemd/system/skiff-agent.service ||
	fail "systemd-analyze verify failed"
echo "ok: systemd-analyze verify"
grep -qx 'KillMode=process' /lib/systemd/system/skiff-agent.service || fail "the agent's unit lacks KillMode=process"

echo "== the user and the directories"
getent passwd skiff || fail "no skiff user"
stat -c '%U:%G %a %n' /etc/skiff /etc/skiff/server.hcl /etc/skiff/agent.hcl /var/lib/skiff /var/lib/skiff/server /var/lib/skiff/agent
[ "$(stat -c %U /var/lib/skiff/server)" = skiff ] || fail "/var/lib/skiff/server is not the skiff user's"

# start_server and start_agent run the units' ExecStart lines (and ExecStartPre, ignoring a failure where the
# line says so) as the units' users; stop_both stops them as systemd would: SIGTERM, to the agent's main
# process only (KillMode=process).
start_server() {
	local user cmd
	user=$(unitline skiff-server.service User)
	cmd=$(unitline skiff-server.service ExecStart)
	echo "setpriv --reuid $user --regid $user --init-groups $cmd"
	# shellcheck disable=SC2086 # the unit's command line, split as systemd splits this one (no quotes in it)
	setpriv --reuid "$user" --regid "$user" --init-groups $cmd >>/tmp/server.log 2>&1 &
	server_pid=$!
	waitfor 180 "server /readyz" curl -ksf https://127.0.0.1:6443/readyz
}
start_agent() {
	local pre cmd
	while IFS= read -r pre; do
		echo "ExecStartPre: $pre"
		${pre#-} || [ "${pre:0:1}" = - ] || fail "ExecStartPre $pre failed"
	done < <(sed -n 's/^ExecStartPre=//p' /lib/systemd/system/skiff-agent.service)
	cmd=$(unitline skiff-agent.service ExecStart)
	echo "$cmd"
	$cmd >>/tmp/agent.log 2>&1 &
	agent_pid=$!
	waitfor 240 "node $node Ready" ready
	echo "node $node: $(tr -d ' \n' </tmp/node.json | grep -o '"type":"Ready","status":"True"[^}]*}')"
}
stop_both() {
	kill -TERM "$agent_pid"
	wait "$agent_pid" || true
	kill -TERM "$server_pid"
	wait "$server_pid" || true
	for p in /proc/[0-9]*; do
		cmd=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null) || continue
		case "$cmd" in *containerd*|*skiff*) echo "left running after stop (as the units intend): ${p#/proc/} $cmd" ;; esac
	done
}
api() {
	local path=$1
	shift
	curl -ksf -H "Authorization: Bearer $admin" "$@" "https://127.0.0.1:6443$path"
}
node=$(hostname)
ready() { api "/api/v1/nodes/$node" >/tmp/node.json && tr -d ' \n' </tmp/node.json | grep -c '"type":"Ready","status":"True"' >/dev/null; }
running() { api /api/v1/namespaces/default/pods/pkgtest >/tmp/pod.json && tr -d ' \n' </tmp/pod.json | grep -c '"phase":"Running"' >/dev/null; }

echo "== the server, from skiff-server.service's ExecStart, as its User"
start_server
waitfor 60 "server join token" test -s /var/lib/skiff/server/join-token
token=$(cat /var/lib/skiff/server/join-token)
admin=$(cat /var/lib/skiff/server/admin-token)
skiff operator raft list-peers -kubeconfig /var/lib/skiff/server/admin.kubeconfig

echo "== the agent, from skiff-agent.service's ExecStart, as root; the example with its token set"
# The one edit the shipped example asks for (its own comment's command).
sed -i "s|^  token .*|  token   = \"$token\"|" /etc/skiff/agent.hcl
start_agent

echo "== a pod (the agent's own pause image, an emptyDir), for the upgrade to keep and the teardown to remove"
pod='{"apiVersion":"v1","kind":"Pod","metadata":{"name":"pkgtest","namespace":"default"},"spec":{
 "containers":[{"name":"c","image":"skiff.local/pause:1","imagePullPolicy":"IfNotPresent",
  "volumeMounts":[{"name":"scratch","mountPath":"/scratch"}]}],"volumes":[{"name":"scratch","emptyDir":{}}]}}'
create() {
	api /api/v1/namespaces/default/pods/pkgtest >/dev/null ||
		api /api/v1/namespaces/default/pods -X POST -H 'Content-Type: application/json' -d "$pod"
}
waitfor 60 "pod created" create
waitfor 90 "pod Running" running
echo "network namespaces: $(ls /run/netns | tr '\n' ' ')"
echo "links: $(ip -o link show | awk -F': ' '{print $2}' | tr '\n' ' ')"
echo "iptables chains of skiff's: $(iptables-save | grep -c '^:SKIFF')"

echo "== upgrade: stop both, dpkg -i of a newer version, start both again"
stop_both
# The containers' stdio processes: argv[0] is skiff-container-io.
ioprocs() {
	local p
	for p in /proc/[0-9]*; do
		if [ "$(tr '\0' '\n' <"$p/cmdline" 2>/dev/null | head -n 1 || true)" = skiff-container-io ]; then echo "${p#/proc/}"; fi
	done | sort | tr '\n' ' '
}
io_before=$(ioprocs)
[ -n "$io_before" ] || fail "no skiff-container-io process before the upgrade"
dpkg -i /tmp/skiff-upgrade.deb
dpkg -s skiff | grep -E '^Version:'
grep -qF "token   = \"$token\"" /etc/skiff/agent.hcl || fail "the upgrade did not keep the edited /etc/skiff/agent.hcl"
echo "ok: the edited conffile kept"
io_after=$(ioprocs)
[ "$io_before" = "$io_after" ] || fail "the upgrade changed the container's processes: $io_before, then $io_after"
echo "ok: the pod's container kept running through the upgrade"
start_server
start_agent
waitfor 60 "pod Running after the upgrade" running
tr -d ' \n' </tmp/pod.json | grep -q '"restartCount":0' || fail "the pod's container restarted over the upgrade"
echo "ok: the pod's container was not restarted"

echo "== stop both as systemd would"
stop_both

echo "== dpkg --purge"
dpkg --purge skiff

echo "== nothing left"
snapshot >/tmp/files-after
left=$(comm -13 /tmp/files-before /tmp/files-after)
# containerd, runc and ip netns make their state directories under /run (a tmpfs) and leave them, empty, as
# they do for any user: those are allowed, files in them are not.
rundirs=$(echo "$left" | grep -E '^/run/(containerd|netns)(/|$)' || true)
left=$(echo "$left" | grep -vE '^/run/(containerd|netns)(/|$)' || true)
for d in $rundirs; do
	[ -d "$d" ] && [ -z "$(find "$d" ! -type d)" ] || left="$left $d"
done
[ -z "$left" ] || fail "files left after purge: $left"
[ -z "$rundirs" ] || echo "empty runtime directories left on /run (tmpfs): $(echo $rundirs)"
echo "ok: no file the package or its services made is left (outside /proc, /sys, /dev, /tmp and dpkg's own records)"
! getent passwd skiff >/dev/null || fail "the skiff user is left"
! getent group skiff >/dev/null || fail "the skiff group is left"
echo "ok: no skiff user or group"
rules=$( (iptables-save; ip6tables-save) 2>/dev/null | grep -i skiff || true)
[ -z "$rules" ] || fail "iptables rules left: $rules"
echo "ok: no iptables rule or chain of skiff's"
mounts=$(mountpoints | comm -13 /tmp/mounts-before -)
[ -z "$mounts" ] || fail "mounts left: $mounts"
echo "ok: no mount left (the pod's rootfs, volumes and network namespace pins are gone)"
netns=$(ls /run/netns 2>/dev/null || true)
[ -z "$netns" ] || fail "network namespaces left: $netns"
links=$(ip -o link show | grep -v ' lo:' || true)
[ -z "$links" ] || fail "links left: $links"
echo "ok: no network namespace, bridge or veth"
procs=
for p in /proc/[0-9]*; do
	[ "${p#/proc/}" = 1 ] && continue
	[ "${p#/proc/}" = "$$" ] && continue
	cmd=$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null) || continue
	case "$cmd" in *containerd*|*skiff*|*runc*) procs="$procs ${p#/proc/}:$cmd" ;; esac
done
[ -z "$procs" ] || fail "processes left: $procs"
echo "ok: no process of skiff's or containerd's"
