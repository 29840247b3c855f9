package e2e

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/internal/testimages"
)

const sidecarPodYAML = `apiVersion: v1
kind: Pod
metadata: {name: side}
spec:
  terminationGracePeriodSeconds: 1
  securityContext:
    sysctls: [{name: kernel.shm_rmid_forced, value: "1"}, {name: net/ipv4/ip_local_port_range, value: "20000 30000"}]
  initContainers:
  - name: sidecar
    image: %[1]s
    restartPolicy: Always
    command: ["sh", "-c", "touch /tmp/alive; exec sleep 3600"]
    livenessProbe:
      exec: {command: ["cat", "/tmp/alive"]}
      periodSeconds: 1
      failureThreshold: 1
      timeoutSeconds: 10 # the default 1 s: a busy machine fails the probe by its timeout, not its file
  containers:
  - name: app
    image: %[1]s
    command: ["sleep", "3600"]
---
apiVersion: v1
kind: Pod
metadata: {name: unsafe-sysctl}
spec:
  securityContext:
    sysctls: [{name: kernel.msgmax, value: "10000000000"}]
  containers:
  - name: app
    image: %[1]s
    command: ["sleep", "3600"]
---
apiVersion: v1
kind: Pod
metadata: {name: deadline}
spec:
  activeDeadlineSeconds: 5
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: %[1]s
    command: ["sleep", "3600"]
---
apiVersion: v1
kind: Pod
metadata: {name: shared-pid}
spec:
  terminationGracePeriodSeconds: 1
  shareProcessNamespace: true
  containers:
  - name: app
    image: %[1]s
    command: ["sleep", "3601"]
  - name: viewer
    image: %[1]s
    command: ["sleep", "3602"]
---
apiVersion: v1
kind: Pod
metadata: {name: host-pid-ipc}
spec:
  terminationGracePeriodSeconds: 1
  hostPID: true
  hostIPC: true
  containers:
  - name: app
    image: %[1]s
    command: ["sleep", "3603"]
---
apiVersion: v1
kind: Pod
metadata: {name: guaranteed}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: %[1]s
    command: ["sleep", "3608"]
    resources:
      limits: {cpu: 100m, memory: 64Mi}
---
apiVersion: v1
kind: Pod
metadata: {name: resize}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: inplace
    image: %[1]s
    command: ["sleep", "3604"]
    resources:
      requests: {cpu: 100m, memory: 32Mi}
      limits: {cpu: 200m, memory: 64Mi}
  - name: restart
    image: %[1]s
    command: ["sleep", "3605"]
    resizePolicy: [{resourceName: memory, restartPolicy: RestartContainer}]
    resources:
      requests: {cpu: 50m, memory: 32Mi}
      limits: {memory: 64Mi}
`

// TestRealPodSpecNodeRules runs, on containerd, what the node decides of a pod spec (docs/operations.md):
// safe sysctls set in the pod's namespaces (seen by its containers); an unsafe one refused by the node with
// SysctlForbidden and nothing started; a sidecar restarted when its liveness probe fails; and a pod past its
// activeDeadlineSeconds killed and Failed with DeadlineExceeded; hostPID, hostIPC and shareProcessNamespace;
// in-place resize (pods/resize) of a running container's cgroup, and of one whose policy restarts it, and a
// resize the node cannot admit.
func TestRealPodSpecNodeRules(t *testing.T) {
	parallelOnHostNetwork(t)
	requireRealRuntime(t)
	registry := testimages.StartRegistry(t)
	images := testimages.Push(t, registry)
	c := proctest.NewCluster(t, 1, fmt.Sprintf("token = %q", joinToken))
	c.Start(c.Procs[0])
	k := kubectl{t: t, kubeconfig: c.Procs[0].Kubeconfig()}
	k.waitForAPI("default")
	agent := newRealAgent(t, apiAddr(t, c.Procs[0].Kubeconfig()), registry)
	agent.start()
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := k.run("describe", "pods")
			t.Logf("kubectl describe pods:\n%s", out)
		}
	})
	proctest.WaitFor(t, "the node Ready", 60*time.Second, func() error {
		if out, err := k.run("get", "node", agent.name, "--no-headers"); err != nil || !strings.Contains(out, " Ready ") {
			return fmt.Errorf("not yet: %s", out)
		}
		return nil
	})
	applyYAML(t, k, fmt.Sprintf(sidecarPodYAML, images.Busybox))

	// Safe sysctls are set in the pod's IPC and network namespaces, which the app container shares.
	proctest.WaitFor(t, "side Running with the sidecar and the app ready", 120*time.Second, func() error {
		out := k.ok("get", "pod", "side", "-o", "jsonpath={.status.phase} {.status.initContainerStatuses[0].ready} {.status.containerStatuses[0].ready}")
		if out != "Running true true" {
			return fmt.Errorf("not yet: %s", out)
		}
		return nil
	})
	if got := strings.TrimSpace(k.stdout("exec", "side", "-c", "app", "--", "cat", "/proc/sys/kernel/shm_rmid_forced")); got != "1" {
		t.Errorf("kernel.shm_rmid_forced in the app container = %q, want 1", got)
	}
	if got := strings.Join(strings.Fields(k.stdout("exec", "side", "-c", "app", "--", "cat", "/proc/sys/net/ipv4/ip_local_port_range")), " "); got != "20000 30000" {
		t.Errorf("net.ipv4.ip_local_port_range in the app container = %q, want 20000 30000", got)
	}

	// Process and IPC namespaces: a container of its own by default (its command is PID 1); the sandbox's, with
	// the pause process as PID 1 and the other container's processes in sight, with shareProcessNamespace;
	// the node's with hostPID and hostIPC.
	if got := strings.TrimSpace(k.stdout("exec", "side", "-c", "app", "--", "cat", "/proc/1/cmdline")); !strings.HasPrefix(got, "sleep") {
		t.Errorf("PID 1 of a container of its own: %q, want its sleep", got)
	}
	for _, pod := range []string{"shared-pid", "host-pid-ipc", "guaranteed"} {
		proctest.WaitFor(t, pod+" Running", 120*time.Second, func() error {
			if out := k.ok("get", "pod", pod, "-o", "jsonpath={.status.phase}"); out != "Running" {
				return fmt.Errorf("not yet: %s", out)
			}
			return nil
		})
	}
	if got := k.stdout("exec", "shared-pid", "-c", "viewer", "--", "cat", "/proc/1/cmdline"); !strings.Contains(got, "pause") {
		t.Errorf("PID 1 with shareProcessNamespace: %q, want the pause process", got)
	}
	if got := k.stdout("exec", "shared-pid", "-c", "viewer", "--", "ps"); !strings.Contains(got, "sleep 3601") || !strings.Contains(got, "sleep 3602") {
		t.Errorf("with shareProcessNamespace the viewer sees:\n%s\nwant both containers' sleeps", got)
	}
	for _, ns := range []string{"pid", "ipc"} {
		host, err := os.Readlink("/proc/self/ns/" + ns)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(k.stdout("exec", "host-pid-ipc", "--", "readlink", "/proc/self/ns/"+ns)); got != host {
			t.Errorf("%s namespace of a hostPID, hostIPC pod: %s, want the node's %s", ns, got, host)
		}
		if got := strings.TrimSpace(k.stdout("exec", "side", "-c", "app", "--", "readlink", "/proc/self/ns/"+ns)); got == host {
			t.Errorf("%s namespace of a pod without hostPID/hostIPC is the node's", ns)
		}
	}

	// The kubelet's OOM score adjustments: 1000 for a BestEffort container; the lowest the agent may give for a
	// Guaranteed one (-997, or the agent's own where it lacks CAP_SYS_RESOURCE, as in some sandboxes).
	if got := strings.TrimSpace(k.stdout("exec", "side", "-c", "app", "--", "cat", "/proc/1/oom_score_adj")); got != "1000" {
		t.Errorf("oom_score_adj of a BestEffort container: %s, want 1000", got)
	}
	if got := strings.TrimSpace(k.stdout("exec", "guaranteed", "--", "cat", "/proc/1/oom_score_adj")); got != "-997" && got != "0" {
		t.Errorf("oom_score_adj of a Guaranteed container: %s, want -997 (or 0, the agent's own, without CAP_SYS_RESOURCE)", got)
	}

	// An unsafe sysctl: refused by the node, nothing started.
	proctest.WaitFor(t, "unsafe-sysctl Failed with SysctlForbidden", 60*time.Second, func() error {
		out := k.ok("get", "pod", "unsafe-sysctl", "-o", "jsonpath={.status.phase} {.status.reason} {.status.message}")
		if !strings.HasPrefix(out, `Failed SysctlForbidden Pod was rejected: forbidden sysctl: "kernel.msgmax" not allowlisted`) {
			return fmt.Errorf("not yet: %s", out)
		}
		return nil
	})
	if out := k.ok("get", "pod", "unsafe-sysctl", "-o", "jsonpath={.status.containerStatuses}"); out != "" {
		t.Errorf("the refused pod reports containers: %s", out)
	}

	// The sidecar's liveness probe fails: it is restarted, the app container is not.
	k.stdout("exec", "side", "-c", "sidecar", "--", "rm", "/tmp/alive")
	proctest.WaitFor(t, "the sidecar restarted", 60*time.Second, func() error {
		out := k.ok("get", "pod", "side", "-o", "jsonpath={.status.initContainerStatuses[0].restartCount} {.status.containerStatuses[0].restartCount}")
		if out != "1 0" {
			return fmt.Errorf("restart counts (sidecar, app) %q", out)
		}
		return nil
	})

	// The active deadline: killed and Failed with DeadlineExceeded.
	proctest.WaitFor(t, "deadline Failed with DeadlineExceeded", 60*time.Second, func() error {
		out := k.ok("get", "pod", "deadline", "-o", "jsonpath={.status.phase} {.status.reason}")
		if out != "Failed DeadlineExceeded" {
			return fmt.Errorf("not yet: %s", out)
		}
		return nil
	})
	if out := ctr(t, agent, "containers", "ls", "-q"); strings.Contains(out, k.pod("deadline").Metadata.UID) {
		t.Errorf("containers of the pod past its deadline remain:\n%s", out)
	}

	checkInPlaceResize(t, k)
	checkImageAndCSIVolumes(t, k, images)
}

// checkImageAndCSIVolumes runs a pod with an image volume (the server image, pulled Always from the test
// registry) and one with a CSI inline volume: the first sees the image's files read-only; the second, whose
// driver no node runs, waits with a FailedMount event that names it, and goes when deleted.
func checkImageAndCSIVolumes(t *testing.T, k kubectl, images testimages.Images) {
	t.Helper()
	applyYAML(t, k, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: imagevol}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: %[1]s
    command: ["sleep", "3606"]
    volumeMounts: [{name: img, mountPath: /srv/img}]
  volumes:
  - name: img
    image: {reference: %[2]s, pullPolicy: Always}
---
apiVersion: v1
kind: Pod
metadata: {name: csivol}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: %[1]s
    command: ["sleep", "3607"]
    volumeMounts: [{name: inline, mountPath: /data}]
  volumes:
  - name: inline
    csi: {driver: e2e.example.com}
`, images.Busybox, images.Server))
	proctest.WaitFor(t, "imagevol Running", 120*time.Second, func() error {
		if out := k.ok("get", "pod", "imagevol", "-o", "jsonpath={.status.phase}"); out != "Running" {
			return fmt.Errorf("not yet: %s", out)
		}
		return nil
	})
	if out, err := k.run("exec", "imagevol", "--", "sh", "-c", "test -x /srv/img/server && echo found; touch /srv/img/x 2>&1 || true"); err != nil ||
		!strings.Contains(out, "found") || !strings.Contains(out, "Read-only file system") {
		t.Errorf("in the image volume: %q, %v; want the image's /server and a read-only file system", out, err)
	}
	proctest.WaitFor(t, "csivol's FailedMount event", 60*time.Second, func() error {
		out := k.ok("get", "events", "--field-selector", "involvedObject.name=csivol,reason=FailedMount", "-o", "jsonpath={.items[*].message}")
		if !strings.Contains(out, "driver name e2e.example.com not found in the list of registered CSI drivers") {
			return fmt.Errorf("events: %q", out)
		}
		return nil
	})
	if out := k.ok("get", "pod", "csivol", "-o", "jsonpath={.status.phase}"); out != "Pending" {
		t.Errorf("the pod with a CSI volume of no driver is %s, want Pending", out)
	}
	k.ok("delete", "pod", "csivol", "imagevol", "--wait", "--timeout=60s")
}

// checkInPlaceResize resizes the resize pod: its inplace container's cgroup changes under the running
// process, its restart container (resizePolicy RestartContainer for memory) is restarted with the new limit,
// and the status reports what the cgroups have; then a resize larger than the node is left pending.
func checkInPlaceResize(t *testing.T, k kubectl) {
	t.Helper()
	proctest.WaitFor(t, "resize Running", 120*time.Second, func() error {
		if out := k.ok("get", "pod", "resize", "-o", "jsonpath={.status.phase}"); out != "Running" {
			return fmt.Errorf("not yet: %s", out)
		}
		return nil
	})
	// The machine's cgroup version decides the files; the container sees its own cgroup at /sys/fs/cgroup.
	cgroupV2 := strings.TrimSpace(k.stdout("exec", "resize", "-c", "inplace", "--", "sh", "-c", "test -f /sys/fs/cgroup/cpu.max && echo v2 || echo v1")) == "v2"
	quota := func(container string) string {
		if cgroupV2 {
			return strings.Fields(k.stdout("exec", "resize", "-c", container, "--", "cat", "/sys/fs/cgroup/cpu.max"))[0]
		}
		return strings.TrimSpace(k.stdout("exec", "resize", "-c", container, "--", "cat", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us"))
	}
	memory := func(container string) string {
		if cgroupV2 {
			return strings.TrimSpace(k.stdout("exec", "resize", "-c", container, "--", "cat", "/sys/fs/cgroup/memory.max"))
		}
		return strings.TrimSpace(k.stdout("exec", "resize", "-c", container, "--", "cat", "/sys/fs/cgroup/memory/memory.limit_in_bytes"))
	}
	if q, m := quota("inplace"), memory("inplace"); q != "20000" || m != "67108864" {
		t.Errorf("before the resize: cpu quota %s, memory limit %s; want 20000 (200m) and 67108864 (64Mi)", q, m)
	}
	containerID := func() string {
		return k.ok("get", "pod", "resize", "-o", "jsonpath={.status.containerStatuses[0].containerID}")
	}
	before := containerID()
	k.ok("patch", "pod", "resize", "--subresource", "resize", "-p",
		`{"spec":{"containers":[{"name":"inplace","resources":{"requests":{"cpu":"150m"},"limits":{"cpu":"300m","memory":"96Mi"}}},{"name":"restart","resources":{"limits":{"memory":"80Mi"}}}]}}`)
	const done = "2 2 0 1 300m 96Mi 80Mi 150m resize conditions:"
	proctest.WaitFor(t, "the resize applied", 60*time.Second, func() error {
		out := k.ok("get", "pod", "resize", "-o", "jsonpath={.metadata.generation} {.status.observedGeneration} "+
			"{.status.containerStatuses[0].restartCount} {.status.containerStatuses[1].restartCount} "+
			"{.status.containerStatuses[0].resources.limits.cpu} {.status.containerStatuses[0].resources.limits.memory} "+
			"{.status.containerStatuses[1].resources.limits.memory} {.status.containerStatuses[0].allocatedResources.cpu} resize conditions:"+
			"{.status.conditions[?(@.type=='PodResizeInProgress')].status}{.status.conditions[?(@.type=='PodResizePending')].status}")
		if out != done {
			return fmt.Errorf("generation, observed, restarts, resources: %q, want %q", out, done)
		}
		return nil
	})
	if q, m := quota("inplace"), memory("inplace"); q != "30000" || m != "100663296" {
		t.Errorf("after the resize: cpu quota %s, memory limit %s; want 30000 (300m) and 100663296 (96Mi)", q, m)
	}
	if now := containerID(); now != before {
		t.Errorf("the inplace container changed (%s, then %s): it was not resized in place", before, now)
	}
	if m := memory("restart"); m != "83886080" {
		t.Errorf("the restarted container's memory limit %s, want 83886080 (80Mi)", m)
	}

	// More cpu than the node has: pending, Infeasible, and the containers keep what they were given.
	k.ok("patch", "pod", "resize", "--subresource", "resize", "-p", `{"spec":{"containers":[{"name":"inplace","resources":{"requests":{"cpu":"1000"},"limits":{"cpu":"1000"}}}]}}`)
	proctest.WaitFor(t, "the resize pending", 60*time.Second, func() error {
		out := k.ok("get", "pod", "resize", "-o", "jsonpath={.status.observedGeneration} {.status.conditions[?(@.type=='PodResizePending')].reason} "+
			"{.status.containerStatuses[0].allocatedResources.cpu} {.status.containerStatuses[0].resources.limits.cpu}")
		if out != "3 Infeasible 150m 300m" {
			return fmt.Errorf("observed, pending reason, allocated and applied cpu: %q", out)
		}
		return nil
	})
	if q := quota("inplace"); q != "30000" {
		t.Errorf("a pending resize changed the cgroup: cpu quota %s, want 30000", q)
	}
}
