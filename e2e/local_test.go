package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/internal/images"
	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/internal/testimages"
	"github.com/skiff-dev/skiff/localcluster"
)

// TestLocalHACluster brings up `skiff local up --servers 3 --agents 2`: five hosts, each a network namespace
// with its own address and iptables on a shared bridge, agents on the real runtime joined by retry_join to a
// single server and started before the servers. Then, with the stock kubectl:
//   - a pod on one agent reaches a pod on the other (pod CIDRs routed host-gw style);
//   - an image given by `--images` runs with no registry;
//   - kill -9 an agent: Unknown with the unreachable taints; a ReplicaSet's pod tolerating that for 5 s is
//     evicted and replaced on the other agent; after a restart the Node is Ready and untainted;
//   - partition an agent's host from the others, then heal it: the same sequence, and the evicted pod does
//     not run on the healed agent (no container of it in its containerd);
//   - partition the leader's host from the agents: no eviction (the disruption guard's case);
//   - a controller-runtime operator in a pod (internal/testimages/operator) reconciles its custom resource
//     before and after the Raft leader's kill, without restarting;
//   - kill -9 the Raft leader: the new leader marks no node unreachable, and does mark a killed agent;
//   - gossip is encrypted throughout (skiff local writes an `encrypt` key into every HCL);
//   - `skiff local down` leaves no namespace, veth or bridge behind.
func TestLocalHACluster(t *testing.T) {
	parallel(t)
	requireRealRuntime(t)
	dir, err := os.MkdirTemp("", "skiff-local-")
	if err != nil {
		t.Fatal(err)
	}
	bin := proctest.Binary(t)
	// --images: a user's image tarball (busybox plus a marker file) every agent imports, no registry involved.
	imageDir := filepath.Join(dir, "user-images")
	spec, err := images.Busybox(images.BusyboxPath)
	if err != nil {
		t.Fatal(err)
	}
	spec.Files = append(spec.Files, images.File{Path: "/marker.txt", Data: []byte("offline-image-ok\n")})
	img, err := images.Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(imageDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := images.WriteTarball(img, "example.test/offline:1", filepath.Join(imageDir, "offline.tar")); err != nil {
		t.Fatal(err)
	}
	if err := testimages.WriteProgramTarball(testimages.Operator, "skiff.test/operator:1", filepath.Join(imageDir, "operator.tar")); err != nil {
		t.Fatal(err)
	}
	st := upLocalCluster(t, bin, dir, "--images", imageDir)
	k := kubectl{t: t, kubeconfig: st.Kubeconfig(dir)}
	k.waitNodeHealth("agent-1", "True/", 60*time.Second)
	k.waitNodeHealth("agent-2", "True/", 60*time.Second)
	// <dir>/kubeconfig has a context per server.
	all := kubectl{t: t, kubeconfig: localcluster.ClusterKubeconfig(dir)}
	mustContain(t, "contexts", all.ok("config", "get-contexts", "-o", "name"), "server-1", "server-2", "server-3")
	mustContain(t, "nodes through server-3", all.ok("--context", "server-3", "get", "nodes"), "agent-1", "agent-2")

	// Pods on different hosts reach each other: busybox httpd on agent-1, wget from agent-2.
	applyYAML(t, k, `apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  nodeName: agent-1
  containers:
  - name: httpd
    image: skiff.local/busybox:1
    # /cgi-bin/peer answers with the source address the connection arrived from.
    command: ["sh", "-c", "mkdir -p /www/cgi-bin && echo hello-from-agent-1 > /www/index.html && printf '#!/bin/sh\\necho\\necho peer=$REMOTE_ADDR\\n' > /www/cgi-bin/peer && chmod +x /www/cgi-bin/peer && httpd -f -p 8080 -h /www"]
`)
	proctest.WaitFor(t, "web Running", 90*time.Second, func() error {
		if s := k.podStatusColumn("web"); s != "Running" {
			return fmt.Errorf("STATUS %s", s)
		}
		return nil
	})
	webIP := k.pod("web").Status.PodIP
	applyYAML(t, k, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: client}
spec:
  nodeName: agent-2
  restartPolicy: OnFailure
  containers:
  - name: wget
    image: skiff.local/busybox:1
    env: [{name: POD_IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}]
    # busybox-static's wget crashes on Debian; nc speaks the HTTP it needs. Pods reach each other without NAT
    # (Kubernetes' network model): web must see the client's own pod IP, not its node's address. (httpd
    # listens on IPv6 too, and writes the address as [::ffff:10.244.0.2].)
    command: ["sh", "-c", "get() { printf \"GET $1 HTTP/1.0\\r\\n\\r\\n\" | nc -w 3 %[1]s 8080; }; get /index.html | grep hello-from-agent-1 && get /cgi-bin/peer | grep -E \"^peer=\\\\[?(::ffff:)?$POD_IP\\\\]?$\""]
`, webIP))
	proctest.WaitFor(t, "client on agent-2 fetched from web on agent-1, which saw the client's pod IP", 90*time.Second, func() error {
		if s := k.podStatusColumn("client"); s != "Completed" {
			return fmt.Errorf("STATUS %s", s)
		}
		return nil
	})

	// The --images tarball runs on an agent with no registry to pull from.
	applyYAML(t, k, `apiVersion: v1
kind: Pod
metadata: {name: offline}
spec:
  nodeName: agent-2
  restartPolicy: Never
  containers: [{name: o, image: example.test/offline:1, imagePullPolicy: Never, command: ["grep", "-q", "offline-image-ok", "/marker.txt"]}]
`)
	proctest.WaitFor(t, "offline Completed", 60*time.Second, func() error {
		if s := k.podStatusColumn("offline"); s != "Completed" {
			return fmt.Errorf("STATUS %s", s)
		}
		return nil
	})

	// A ReplicaSet whose pod tolerates an unreachable node for 5 s: each loss of its node below evicts it,
	// and the ReplicaSet controller replaces it on the other node.
	applyYAML(t, k, `apiVersion: apps/v1
kind: ReplicaSet
metadata: {name: keeper}
spec:
  replicas: 1
  selector: {matchLabels: {app: keeper}}
  template:
    metadata: {labels: {app: keeper}}
    spec:
      terminationGracePeriodSeconds: 2
      tolerations:
      - {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 5}
      containers: [{name: k, image: skiff.local/busybox:1, command: ["sleep", "3600"]}]
`)
	keeper := waitKeeperRunning(t, k, "")

	// kill -9 the keeper's agent: Unknown, unreachable taints, the pod evicted after 5 s and replaced on the
	// other agent; restarted: Ready, untainted, and the evicted pod's deletion confirmed.
	lost := keeper.node
	if err := st.Kill(lost); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	k.waitNodeHealth(lost, "Unknown/NodeStatusUnknown node.kubernetes.io/unreachable", 60*time.Second)
	t.Logf("%s marked unreachable %v after kill -9", lost, time.Since(killed).Round(100*time.Millisecond))
	replacement := waitKeeperRunning(t, k, lost)
	t.Logf("keeper replaced on %s %v after kill -9", replacement.node, time.Since(killed).Round(100*time.Millisecond))
	if err := st.Start(dir, lost); err != nil {
		t.Fatal(err)
	}
	k.waitNodeHealth(lost, "True/", 60*time.Second)
	waitPodGone(t, k, keeper.name)

	// Partition the keeper's new host from every other host, then heal it: the same sequence. (Cut off from
	// the servers alone, it would stay alive: gossip's indirect probes through the other agent still reach it.)
	keeper, lost = replacement, replacement.node
	var others []string
	for _, h := range st.Hosts {
		if h.Name != lost {
			others = append(others, h.IP)
		}
	}
	if err := st.Partition(lost, others); err != nil {
		t.Fatal(err)
	}
	k.waitNodeHealth(lost, "Unknown/NodeStatusUnknown node.kubernetes.io/unreachable", 60*time.Second)
	replacement = waitKeeperRunning(t, k, lost)
	if err := st.Heal(lost, others); err != nil {
		t.Fatal(err)
	}
	k.waitNodeHealth(lost, "True/", 60*time.Second)
	// No pod runs twice: the healed agent kills the evicted pod and confirms its deletion, its containerd
	// holds no container of it, and the ReplicaSet has its one pod, on the other node.
	waitPodGone(t, k, keeper.name)
	sock := filepath.Join(dir, lost, "data", "containerd", "containerd.sock")
	if out, err := exec.Command("ctr", "--address", sock, "-n", "skiff", "containers", "ls", "-q",
		fmt.Sprintf(`labels."io.skiff.pod.uid"==%s`, keeper.uid)).CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "" {
		t.Fatalf("containers of the evicted pod %s left on %s after the heal: %v %s", keeper.name, lost, err, out)
	}
	if again := waitKeeperRunning(t, k, lost); again.name != replacement.name {
		t.Fatalf("keeper is %s after the heal, want the replacement %s", again.name, replacement.name)
	}
	if p := k.pod("client"); p.Status.Phase != "Succeeded" {
		t.Fatalf("client after the heal: %s", p.Status.Phase)
	}

	// Partition the leader's host from every agent: the disruption guard holds (the agents are unreachable
	// from the leader alone, and gossip's indirect probes through the other servers keep them alive, so
	// nothing is marked lost and nothing is evicted).
	leaderName := raftLeader(t, bin, st.Kubeconfig(dir))
	var agentIPs []string
	for _, h := range st.Hosts {
		if h.Role == "agent" {
			agentIPs = append(agentIPs, h.IP)
		}
	}
	applyYAML(t, k, `apiVersion: v1
kind: Pod
metadata: {name: steady}
spec:
  nodeName: agent-2
  tolerations:
  - {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 1}
  containers: [{name: s, image: skiff.local/busybox:1, command: ["sleep", "3600"]}]
`)
	proctest.WaitFor(t, "steady Running", 60*time.Second, func() error {
		if s := k.podStatusColumn("steady"); s != "Running" {
			return fmt.Errorf("STATUS %s", s)
		}
		return nil
	})
	if err := st.Partition(leaderName, agentIPs); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
		if out, _ := k.run("get", "pod", "steady", "-o", "jsonpath={.metadata.deletionTimestamp}"); strings.TrimSpace(out) != "" {
			t.Fatalf("steady was evicted while only the leader was cut off from the agents")
		}
	}
	if err := st.Heal(leaderName, agentIPs); err != nil {
		t.Fatal(err)
	}

	// A controller-runtime operator in a pod reconciles its custom resource before the leader's kill below.
	k.ok("apply", "-f", "testdata/greeting-operator.yaml")
	k.ok("wait", "--for=condition=Established", "crd/greetings.demo.skiff.dev", "--timeout=30s")
	k.ok("rollout", "status", "-n", "greeting-system", "deploy/greeting-operator", "--timeout=120s")
	applyYAML(t, k, `apiVersion: demo.skiff.dev/v1
kind: Greeting
metadata: {name: hello}
spec: {message: before the failover}
`)
	waitGreeting(t, k, "hello", "before the failover", 1)

	// kill -9 the Raft leader: nothing is marked unreachable by its successor.
	leader := raftLeader(t, bin, st.Kubeconfig(dir))
	if err := st.Kill(leader); err != nil {
		t.Fatal(err)
	}
	survivor := "server-1"
	if leader == "server-1" {
		survivor = "server-2"
	}
	k2 := kubectl{t: t, kubeconfig: strings.Replace(st.Kubeconfig(dir), "/server-1/", "/"+survivor+"/", 1)}
	k2.waitForAPI("default")
	// The operator, whose watches and leader election Lease went through the killed server for a third of
	// its connections, goes on reconciling without a restart: a changed Greeting, a new one, and a ConfigMap
	// deleted by hand, which it owns and puts back.
	k2.ok("patch", "greeting", "hello", "--type=merge", "-p", `{"spec":{"message":"after the failover"}}`)
	waitGreeting(t, k2, "hello", "after the failover", 2)
	applyYAML(t, k2, `apiVersion: demo.skiff.dev/v1
kind: Greeting
metadata: {name: later}
spec: {message: created after the failover}
`)
	waitGreeting(t, k2, "later", "created after the failover", 1)
	k2.ok("delete", "configmap", "later")
	waitGreeting(t, k2, "later", "created after the failover", 1)
	if restarts := k2.ok("get", "pods", "-n", "greeting-system", "-o", "jsonpath={.items[*].status.containerStatuses[*].restartCount}"); restarts != "0" {
		t.Errorf("the operator restarted across the leader's kill: restartCount %s\n%s", restarts, k2.ok("logs", "-n", "greeting-system", "deploy/greeting-operator", "--previous"))
	}
	// The garbage collector removes a Greeting's ConfigMap with it (the operator made the Greeting its owner).
	k2.ok("delete", "greeting", "hello")
	proctest.WaitFor(t, "hello's ConfigMap collected", 60*time.Second, func() error {
		if out, _ := k2.run("get", "configmap", "hello"); !strings.Contains(out, "NotFound") {
			return fmt.Errorf("still there: %s", out)
		}
		return nil
	})
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		for _, n := range []string{"agent-1", "agent-2"} {
			if got := k2.nodeHealth(n); strings.Contains(got, "Unknown") || strings.Contains(got, "unreachable") {
				t.Fatalf("after the leader's failover node %s is %q", n, got)
			}
		}
		time.Sleep(time.Second)
	}
	// ... and keeps maintaining node status: a killed agent goes Unknown, and Ready again once restarted.
	if err := st.Kill("agent-1"); err != nil {
		t.Fatal(err)
	}
	k2.waitNodeHealth("agent-1", "Unknown/NodeStatusUnknown node.kubernetes.io/unreachable", 60*time.Second)
	if err := st.Start(dir, "agent-1"); err != nil {
		t.Fatal(err)
	}
	k2.waitNodeHealth("agent-1", "True/", 60*time.Second)
}

// waitGreeting waits until the operator has reconciled the Greeting name of the default namespace: its
// ConfigMap holds message, and its status says the generation and the ConfigMap.
func waitGreeting(t *testing.T, k kubectl, name, message string, generation int) {
	t.Helper()
	proctest.WaitFor(t, "the operator reconciled Greeting "+name, 60*time.Second, func() error {
		got, err := k.run("get", "configmap", name, "-o", "jsonpath={.data.message}")
		if err != nil || got != message {
			return fmt.Errorf("ConfigMap %s: %v %q", name, err, got)
		}
		status, err := k.run("get", "greeting", name, "-o", "jsonpath={.status.observedGeneration} {.status.configMap}")
		if want := fmt.Sprintf("%d %s", generation, name); err != nil || status != want {
			return fmt.Errorf("status %q, want %q: %v", status, want, err)
		}
		return nil
	})
}

// upLocalCluster runs `skiff local up --servers 3 --agents 2` in dir with the extra arguments, and has the
// test's cleanup bring it down and remove dir. When the test fails, each server is sent SIGQUIT first and the
// tail of every host's log is logged, with the node lifecycle controller's goroutines (a stuck leader service
// shows where it waits).
func upLocalCluster(t *testing.T, bin, dir string, extra ...string) *localcluster.State {
	t.Helper()
	args := append([]string{"local", "up", "--servers", "3", "--agents", "2", "--dir", dir}, extra...)
	out, err := exec.Command(bin, args...).CombinedOutput()
	st, loadErr := localcluster.Load(dir)
	t.Cleanup(func() {
		if t.Failed() && st != nil {
			for _, h := range st.Hosts {
				if h.Role == "server" {
					_ = st.Signal(h.Name, syscall.SIGQUIT, 5*time.Second)
				}
			}
			for _, h := range st.Hosts {
				if data, err := os.ReadFile(h.Log); err == nil {
					log, stacks := splitGoroutineDump(string(data))
					t.Logf("--- %s log (tail) ---\n%s", h.Name, tailString(log, 3000))
					if mine := goroutinesIn(stacks, "skiff/controller.runNodeLifecycle", "skiff/controller.(*lifecycle)"); mine != "" {
						t.Logf("--- %s node lifecycle controller at exit ---\n%s", h.Name, tailString(mine, 6000))
					}
				}
			}
		}
		if out, err := exec.Command(bin, "local", "down", "--dir", dir).CombinedOutput(); err != nil {
			t.Errorf("skiff local down: %v\n%s", err, out)
		}
		os.RemoveAll(dir)
	})
	if err != nil || loadErr != nil {
		t.Fatalf("skiff local up: %v %v\n%s", err, loadErr, out)
	}
	return st
}

// keeperPod is the Running pod of the keeper ReplicaSet.
type keeperPod struct{ name, uid, node string }

// waitKeeperRunning waits until the keeper ReplicaSet has exactly one pod that is not being deleted, Running
// on a node other than notOn, and returns it.
func waitKeeperRunning(t *testing.T, k kubectl, notOn string) keeperPod {
	t.Helper()
	var got keeperPod
	proctest.WaitFor(t, "one Running keeper pod not on "+notOn, 90*time.Second, func() error {
		out := k.ok("get", "pods", "-l", "app=keeper", "-o",
			`jsonpath={range .items[*]}{.metadata.name} {.metadata.uid} {.spec.nodeName} {.status.phase} {.metadata.deletionTimestamp}{"\n"}{end}`)
		var live []keeperPod
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			f := strings.Fields(line)
			switch len(f) {
			case 3: // not scheduled yet
				return fmt.Errorf("pod %s is not scheduled", f[0])
			case 4: // not being deleted
				if f[3] != "Running" || f[2] == notOn {
					return fmt.Errorf("pod %s is %s on %q", f[0], f[3], f[2])
				}
				live = append(live, keeperPod{name: f[0], uid: f[1], node: f[2]})
			}
		}
		if len(live) != 1 {
			return fmt.Errorf("%d live keeper pods:\n%s", len(live), out)
		}
		got = live[0]
		return nil
	})
	return got
}

// waitPodGone waits until the pod no longer exists: its agent confirmed the deletion.
func waitPodGone(t *testing.T, k kubectl, name string) {
	t.Helper()
	proctest.WaitFor(t, name+"'s deletion confirmed by its agent", 60*time.Second, func() error {
		if out, _ := k.run("get", "pod", name); !strings.Contains(out, "NotFound") {
			return fmt.Errorf("still there: %s", out)
		}
		return nil
	})
}

// raftLeader is the current Raft leader's name, from `skiff operator raft list-peers`.
func raftLeader(t *testing.T, bin, kubeconfig string) string {
	t.Helper()
	var leader string
	proctest.WaitFor(t, "a Raft leader", 30*time.Second, func() error {
		out, err := exec.Command(bin, "operator", "raft", "list-peers", "-kubeconfig", kubeconfig).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		rows, err := proctest.ParsePeers(string(out))
		if err != nil {
			return err
		}
		for _, r := range rows {
			if r.State == "leader" {
				leader = r.Name
				return nil
			}
		}
		return fmt.Errorf("no leader:\n%s", out)
	})
	return leader
}

// splitGoroutineDump splits a log at the Go runtime's SIGQUIT dump ("SIGQUIT: quit"), if it has one.
func splitGoroutineDump(log string) (before, dump string) {
	if i := strings.Index(log, "SIGQUIT: quit"); i >= 0 {
		return log[:i], log[i:]
	}
	return log, ""
}

// goroutinesIn returns the goroutine stacks of a dump that run through any of the given functions, without
// the frame and stack pointers a SIGQUIT dump adds.
func goroutinesIn(dump string, funcs ...string) string {
	var out []string
	for _, g := range strings.Split(dump, "\n\n") {
		for _, f := range funcs {
			if strings.Contains(g, f) {
				out = append(out, framePointers.ReplaceAllString(g, ""))
				break
			}
		}
	}
	return strings.Join(out, "\n\n")
}

var framePointers = regexp.MustCompile(` fp=0x[0-9a-f]+ sp=0x[0-9a-f]+ pc=0x[0-9a-f]+`)

func tailString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}
