package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/internal/testimages"
)

// realAgent is a `skiff agent` on the containerd runtime, with its private containerd under its data dir.
type realAgent struct {
	t       *testing.T
	name    string
	config  string
	dataDir string
	cmd     *exec.Cmd
	out     *syncBuilder
}

type syncBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuilder) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuilder) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// requireRealRuntime skips unless the machine can run real pods: root, containerd, runc and the CNI plugins.
func requireRealRuntime(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("real pods need root")
	}
	for _, bin := range []string{"containerd", "runc", "kubectl", "ip"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not installed (make setup installs it)", bin)
		}
	}
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		t.Skip("containernetworking-plugins not installed (make setup installs it)")
	}
}

// newRealAgent writes the agent's HCL; start runs it. At cleanup the agent is killed and `skiff agent
// -teardown` removes whatever it left on the host: containers, network namespaces, IPs, its bridge and its
// masquerade chain.
func newRealAgent(t *testing.T, server, registry string) *realAgent {
	// A short data dir: containerd's socket path must fit in 107 bytes.
	dir, err := os.MkdirTemp("", "skiff-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	a := &realAgent{t: t, name: fmt.Sprintf("real-%04x", rand.IntN(1<<16)), dataDir: filepath.Join(dir, "data"), out: &syncBuilder{}}
	a.config = filepath.Join(dir, "agent.hcl")
	hcl := fmt.Sprintf(`name      = %q
data_dir  = %q
bind_addr = "127.0.0.1"
log_level = "debug"
agent {
  servers = [%q]
  token   = %q
  registry %q {
    plain_http = true
  }
}
`, a.name, a.dataDir, server, joinToken, registry)
	if err := os.WriteFile(a.config, []byte(hcl), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.kill()
		if t.Failed() {
			t.Logf("agent %s output:\n%s", a.name, a.out.String())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if out, err := exec.CommandContext(ctx, proctest.Binary(t), "agent", "-config", a.config, "-teardown").CombinedOutput(); err != nil {
			t.Errorf("agent teardown: %v\n%s", err, out)
		}
		// Nothing of the agent's outlives its teardown: no shim, no containerd.
		if left := processesMentioning(a.dataDir); len(left) > 0 {
			t.Errorf("processes left after the agent's teardown:\n%s", strings.Join(left, "\n"))
		}
		os.RemoveAll(dir)
	})
	return a
}

// processesMentioning lists the live processes whose command line contains s.
func processesMentioning(s string) []string {
	var out []string
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		raw, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err != nil || len(raw) == 0 || !strings.Contains(string(raw), s) {
			continue
		}
		out = append(out, p.Name()+": "+strings.ReplaceAll(string(raw), "\x00", " "))
	}
	return out
}

func (a *realAgent) start() {
	a.cmd = exec.Command(proctest.Binary(a.t), "agent", "-config", a.config)
	a.cmd.Stdout, a.cmd.Stderr = a.out, a.out
	if err := a.cmd.Start(); err != nil {
		a.t.Fatal(err)
	}
}

// goroutines stops the agent with SIGQUIT and returns the stacks of its goroutines in the containerd
// runtime's code (what a stuck sync waits on), for a failed test's report.
func (a *realAgent) goroutines() string {
	if a.cmd == nil || a.cmd.ProcessState != nil {
		return ""
	}
	before := len(a.out.String())
	_ = a.cmd.Process.Signal(syscall.SIGQUIT)
	_ = a.cmd.Wait()
	var stacks []string
	for _, g := range strings.Split(a.out.String()[before:], "\n\n") {
		if strings.Contains(g, "nodeagent.(*containerdRuntime)") {
			stacks = append(stacks, g)
		}
	}
	return strings.Join(stacks, "\n\n")
}

// kill is kill -9: the agent's private containerd and the containers' shims live on, as a node's
// containerd outlives its kubelet.
func (a *realAgent) kill() {
	if a.cmd != nil && a.cmd.ProcessState == nil {
		a.cmd.Process.Kill()
		a.cmd.Wait()
	}
}

// podJSON is the part of a pod the test reads.
type podJSON struct {
	Metadata struct {
		UID string `json:"uid"`
	} `json:"metadata"`
	Spec struct {
		NodeName string `json:"nodeName"`
	} `json:"spec"`
	Status struct {
		Phase             string `json:"phase"`
		PodIP             string `json:"podIP"`
		ContainerStatuses []struct {
			Name         string `json:"name"`
			Ready        bool   `json:"ready"`
			RestartCount int    `json:"restartCount"`
			ContainerID  string `json:"containerID"`
			State        struct {
				Waiting *struct {
					Reason string `json:"reason"`
				} `json:"waiting"`
				Running *struct {
					StartedAt time.Time `json:"startedAt"`
				} `json:"running"`
			} `json:"state"`
			LastState struct {
				Terminated *struct {
					ExitCode   int       `json:"exitCode"`
					StartedAt  time.Time `json:"startedAt"`
					FinishedAt time.Time `json:"finishedAt"`
				} `json:"terminated"`
			} `json:"lastState"`
		} `json:"containerStatuses"`
	} `json:"status"`
}

func (k kubectl) pod(name string) podJSON {
	k.t.Helper()
	var p podJSON
	if err := json.Unmarshal([]byte(k.ok("get", "pod", name, "-o", "json")), &p); err != nil {
		k.t.Fatal(err)
	}
	return p
}

// podStatusColumn is the STATUS column of `kubectl get pod`.
func (k kubectl) podStatusColumn(name string) string {
	fields := strings.Fields(k.ok("get", "pod", name, "--no-headers"))
	if len(fields) < 3 {
		return ""
	}
	return fields[2]
}

// httpGet returns the body of a 200 answer to a GET of url, or an error that says who answered otherwise.
// Every call opens its own connection, straight to the address: a kept-alive connection could carry a
// wait's retries to whoever answered first (this sandbox's egress proxy, before a LoadBalancer address's
// rules are in), whatever the rules say by then.
func httpGet(url string) (string, error) {
	client := http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		// The Server header says who answered when it is not the pod meant (it has been a 404 with no body).
		return string(body), fmt.Errorf("HTTP %d (Server %q): %s", resp.StatusCode, resp.Header.Get("Server"), body)
	}
	return string(body), nil
}

const webPodYAML = `apiVersion: v1
kind: ConfigMap
metadata: {name: web-config}
data: {greeting.txt: "hello from a configmap"}
---
apiVersion: v1
kind: Secret
metadata: {name: web-secret}
stringData: {message: "secret-message"}
---
apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  terminationGracePeriodSeconds: 20
  initContainers:
  - name: init
    image: %[1]s
    command: ["sh", "-c", "echo initialized > /work/init.txt"]
    volumeMounts: [{name: work, mountPath: /work}]
  containers:
  - name: server
    image: %[2]s
    args: ["-term-file", "/host/term.txt"]
    ports: [{containerPort: 8080, name: http}]
    env:
    - name: MESSAGE
      valueFrom: {secretKeyRef: {name: web-secret, key: message}}
    resources:
      requests: {cpu: 100m, memory: 32Mi}
      limits: {cpu: 500m, memory: 64Mi}
    readinessProbe:
      httpGet: {path: /ready, port: http}
      periodSeconds: 1
    lifecycle:
      preStop:
        exec: {command: ["sh", "-c", "echo prestop > /host/prestop.txt"]}
    volumeMounts:
    - {name: config, mountPath: /config, readOnly: true}
    - {name: work, mountPath: /work}
    - {name: host, mountPath: /host}
  volumes:
  - name: config
    configMap: {name: web-config}
  - name: work
    emptyDir: {}
  - name: host
    hostPath: {path: %[3]s, type: DirectoryOrCreate}
`

// TestRealPodLifecycle runs real pods on containerd, runc and the CNI plugins, pulled from a loopback
// registry, and drives them with the stock kubectl through the whole lifecycle of issue 5's acceptance:
// start-up with init container, volumes, secret env and readiness; HTTP from the host to the pod IP; crash
// loop backoff; a liveness restart; a bad image; graceful deletion with preStop and SIGTERM, and SIGKILL at
// the deadline; nothing left behind; and a kill -9 of the agent that does not restart the running pod.
func TestRealPodLifecycle(t *testing.T) {
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
	hostDir := t.TempDir()

	// 1. A pod with an init container, a ConfigMap volume, a Secret env var, a readiness probe and limits.
	statuses := watchStatuses(t, k, "web")
	applyYAML(t, k, fmt.Sprintf(webPodYAML, images.Busybox, images.Server, hostDir))
	proctest.WaitFor(t, "web Running and Ready", 120*time.Second, func() error {
		if out := k.ok("get", "pod", "web", "--no-headers"); !strings.Contains(out, "1/1") || !strings.Contains(out, "Running") {
			return fmt.Errorf("not yet: %s", out)
		}
		return nil
	})
	seen := statuses()
	if len(seen) == 0 || seen[0] != "Pending" || seen[len(seen)-1] != "Running" || !slices.ContainsFunc(seen, func(s string) bool {
		return s == "ContainerCreating" || strings.HasPrefix(s, "Init:") || s == "PodInitializing"
	}) {
		t.Fatalf("STATUS went %v; want Pending, then ContainerCreating or Init:0/1, then Running", seen)
	}
	describe := k.ok("describe", "pod", "web")
	if err := inOrder(describe, "Scheduled", "Pulling", "Pulled", "Created", "Started"); err != nil {
		t.Fatalf("describe events: %v\n%s", err, describe)
	}
	pod := k.pod("web")
	base := "http://" + pod.Status.PodIP + ":8080"
	body, err := httpGet(base + "/")
	if err != nil || !strings.Contains(body, "message=secret-message") {
		t.Fatalf("GET %s/ from the host: %q, %v", base, body, err)
	}
	if body, err := httpGet(base + "/file?path=/config/greeting.txt"); err != nil || body != "hello from a configmap" {
		t.Fatalf("configmap volume: %q, %v", body, err)
	}
	if body, err := httpGet(base + "/file?path=/work/init.txt"); err != nil || strings.TrimSpace(body) != "initialized" {
		t.Fatalf("init container's file: %q, %v", body, err)
	}
	webID := pod.Status.ContainerStatuses[0].ContainerID

	// 2. A container that exits non-zero: CrashLoopBackOff, with growing restart intervals.
	k.ok("run", "crasher", "--image="+images.Busybox, "--restart=Always", "--command", "--", "sh", "-c", "sleep 2; exit 3")
	// 3. A failing liveness probe restarts its container. 4. A bad image name.
	applyYAML(t, k, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: live}
spec:
  containers:
  - name: server
    image: %s
    livenessProbe:
      httpGet: {path: /healthz, port: 8080}
      periodSeconds: 1
      failureThreshold: 2
`, images.Server))
	k.ok("run", "badimage", "--image="+registry+"/skiff/does-not-exist:1", "--restart=Never")

	proctest.WaitFor(t, "live Running", 60*time.Second, func() error {
		if p := k.pod("live"); p.Status.PodIP == "" || len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].State.Running == nil {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	if _, err := httpGet("http://" + k.pod("live").Status.PodIP + ":8080/fail"); err != nil {
		t.Fatalf("GET /fail: %v", err)
	}
	proctest.WaitFor(t, "live restarted by its liveness probe", 60*time.Second, func() error {
		if p := k.pod("live"); len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].RestartCount < 1 {
			return fmt.Errorf("not yet")
		}
		return nil
	})
	mustContain(t, "live events", k.ok("get", "events", "--field-selector", "involvedObject.name=live"), "Unhealthy", "Liveness probe failed", "Killing")

	var badSeen []string
	proctest.WaitFor(t, "badimage in ImagePullBackOff after ErrImagePull", 90*time.Second, func() error {
		s := k.podStatusColumn("badimage")
		if len(badSeen) == 0 || badSeen[len(badSeen)-1] != s {
			badSeen = append(badSeen, s)
		}
		if s == "ImagePullBackOff" && slices.Contains(badSeen, "ErrImagePull") {
			return nil
		}
		return fmt.Errorf("seen %v", badSeen)
	})

	// Intervals between restarts grow: 10 s, then 20 s. The status shows the last exit and the current start.
	gaps := restartGaps(t, k, "crasher", 3)
	if !(gaps[1] > gaps[0] && gaps[0] >= 8*time.Second) {
		t.Fatalf("restart intervals %v; want growing from about 10 s", gaps)
	}
	proctest.WaitFor(t, "crasher shown as CrashLoopBackOff", 60*time.Second, func() error {
		if s := k.podStatusColumn("crasher"); s != "CrashLoopBackOff" {
			return fmt.Errorf("STATUS %s", s)
		}
		return nil
	})

	// 5. Graceful deletion: preStop, then SIGTERM; the pod is gone well within its 20 s grace period.
	webUID := pod.Metadata.UID
	start := time.Now()
	k.ok("delete", "pod", "web", "--wait=true", "--timeout=60s")
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("deleting web took %v, longer than its grace period", took)
	}
	for _, f := range []string{"prestop.txt", "term.txt"} {
		if data, err := os.ReadFile(filepath.Join(hostDir, f)); err != nil {
			t.Fatalf("%s: %v (preStop and SIGTERM must both happen)", f, err)
		} else if f == "term.txt" && !strings.Contains(string(data), "SIGTERM") {
			t.Fatalf("term.txt: %q", data)
		}
	}
	// A process that ignores SIGTERM is killed at the 3 s deadline.
	applyYAML(t, k, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: stubborn}
spec:
  terminationGracePeriodSeconds: 3
  containers:
  - name: server
    image: %s
    args: ["-ignore-sigterm"]
`, images.Server))
	proctest.WaitFor(t, "stubborn Running", 60*time.Second, func() error {
		if s := k.podStatusColumn("stubborn"); s != "Running" {
			return fmt.Errorf("STATUS %s", s)
		}
		return nil
	})
	stubbornUID := k.pod("stubborn").Metadata.UID
	start = time.Now()
	k.ok("delete", "pod", "stubborn", "--wait=true", "--timeout=60s")
	if took := time.Since(start); took < 3*time.Second || took > 15*time.Second {
		t.Fatalf("deleting a pod that ignores SIGTERM took %v; want the 3 s grace period, then SIGKILL", took)
	}
	// Nothing of the deleted pods remains: containers, network namespaces, veths, IP allocations.
	for _, uid := range []string{webUID, stubbornUID} {
		if _, err := os.Stat("/run/netns/skiff-" + uid); err == nil {
			t.Errorf("network namespace of %s still pinned", uid)
		}
		if out := ctr(t, agent, "containers", "list", "labels.\"io.skiff.pod.uid\"=="+uid); strings.Contains(out, uid) {
			t.Errorf("containers of %s remain:\n%s", uid, out)
		}
	}
	ipamFiles, _ := filepath.Glob(filepath.Join(agent.dataDir, "cni", "ipam", "skiff", "10.*"))
	for _, f := range ipamFiles {
		if owner, _ := os.ReadFile(f); strings.Contains(string(owner), webUID) || strings.Contains(string(owner), stubbornUID) {
			t.Errorf("IP allocation %s still held: %s", filepath.Base(f), owner)
		}
	}

	// 6. kill -9 the agent and start it again: the running pod keeps its container and restart count.
	// A pod force-deleted while the agent is down has its containers, network and IP removed when it is back.
	before := k.pod("live").Status.ContainerStatuses[0]
	orphanUID := k.pod("badimage").Metadata.UID
	agent.kill()
	k.ok("delete", "pod", "badimage", "--force", "--grace-period=0")
	agent.start()
	proctest.WaitFor(t, "the force-deleted pod's sandbox removed", 60*time.Second, func() error {
		if out := ctr(t, agent, "containers", "list", "labels.\"io.skiff.pod.uid\"=="+orphanUID); strings.Contains(out, orphanUID) {
			return fmt.Errorf("still there:\n%s", out)
		}
		if _, err := os.Stat("/run/netns/skiff-" + orphanUID); err == nil {
			return fmt.Errorf("network namespace still pinned")
		}
		return nil
	})
	time.Sleep(5 * time.Second)
	proctest.WaitFor(t, "the agent back, live Ready", 60*time.Second, func() error {
		if out := k.ok("get", "pod", "live", "--no-headers"); !strings.Contains(out, "1/1") {
			return fmt.Errorf("not yet: %s", out)
		}
		return nil
	})
	after := k.pod("live").Status.ContainerStatuses[0]
	if after.ContainerID != before.ContainerID || after.RestartCount != before.RestartCount {
		t.Fatalf("after an agent restart the container went from %s (restarts %d) to %s (restarts %d)",
			before.ContainerID, before.RestartCount, after.ContainerID, after.RestartCount)
	}
	_ = webID
	// The node reports its images.
	mustContain(t, "node images", k.ok("get", "node", agent.name, "-o", "jsonpath={.status.images[*].names}"), "skiff/server:test", "skiff/busybox@sha256:")
	for _, name := range []string{"live", "crasher"} {
		k.ok("delete", "pod", name, "--wait=true", "--timeout=60s")
	}
	if leftovers, _ := filepath.Glob("/run/netns/skiff-*"); len(leftovers) > 0 {
		for _, l := range leftovers {
			if strings.Contains(l, webUID) || strings.Contains(l, stubbornUID) {
				t.Errorf("leftover network namespace %s", l)
			}
		}
	}
	if out, _ := exec.Command("ip", "-o", "link", "show", "master", bridgeOf(t, agent)).CombinedOutput(); strings.Contains(string(out), "veth") {
		t.Errorf("veths remain on the bridge after every pod is gone:\n%s", out)
	}
}

// bridgeOf finds the agent's bridge: the only skiff bridge whose address is the node's pod CIDR gateway.
func bridgeOf(t *testing.T, a *realAgent) string {
	cidr, err := os.ReadFile(filepath.Join(a.dataDir, "pod-cidr"))
	if err != nil {
		t.Fatalf("pod-cidr: %v", err)
	}
	prefix := strings.TrimSuffix(strings.TrimSpace(string(cidr)), "0/24") + "1/24"
	out, _ := exec.Command("ip", "-o", "addr", "show").CombinedOutput()
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 3 && f[3] == prefix && strings.HasPrefix(f[1], "skiff") {
			return f[1]
		}
	}
	t.Fatalf("no bridge with %s:\n%s", prefix, out)
	return ""
}

// ctr runs containerd's CLI against the agent's private containerd.
func ctr(t *testing.T, a *realAgent, args ...string) string {
	out, err := exec.Command("ctr", append([]string{"-a", filepath.Join(a.dataDir, "containerd", "containerd.sock"), "-n", "skiff"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("ctr %v: %v\n%s", args, err, out)
	}
	return string(out)
}

func applyYAML(t *testing.T, k kubectl, doc string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "manifest.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	k.ok("apply", "-f", path)
}

// watchStatuses runs `kubectl get pod -w` and returns a function giving the STATUS values seen, in order.
func watchStatuses(t *testing.T, k kubectl, name string) func() []string {
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "kubectl", "--kubeconfig", k.kubeconfig, "get", "pods", "-w", "--no-headers")
	out := &syncBuilder{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); cmd.Wait() })
	return func() []string {
		var seen []string
		for _, line := range strings.Split(out.String(), "\n") {
			f := strings.Fields(line)
			if len(f) >= 3 && f[0] == name && (len(seen) == 0 || seen[len(seen)-1] != f[2]) {
				seen = append(seen, f[2])
			}
		}
		return seen
	}
}

// inOrder checks that the words appear in s in this order.
func inOrder(s string, words ...string) error {
	at := 0
	for _, w := range words {
		i := strings.Index(s[at:], w)
		if i < 0 {
			return fmt.Errorf("%q missing after position %d", w, at)
		}
		at += i + len(w)
	}
	return nil
}

// restartGaps watches a crash-looping container for n-1 restarts and returns the time each restart waited
// after the exit before it (the status shows both: the running attempt's start and the last exit).
func restartGaps(t *testing.T, k kubectl, name string, n int) []time.Duration {
	var gaps []time.Duration
	last := -1
	deadline := time.Now().Add(3 * time.Minute)
	for len(gaps) < n-1 && time.Now().Before(deadline) {
		p := k.pod(name)
		if len(p.Status.ContainerStatuses) > 0 {
			cs := p.Status.ContainerStatuses[0]
			if cs.RestartCount != last && cs.State.Running != nil && cs.LastState.Terminated != nil {
				gaps = append(gaps, cs.State.Running.StartedAt.Sub(cs.LastState.Terminated.FinishedAt))
				last = cs.RestartCount
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(gaps) < n-1 {
		t.Fatalf("saw restart gaps %v of %s; wanted %d", gaps, name, n-1)
	}
	return gaps
}
