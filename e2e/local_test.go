package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/localcluster"
)

// TestLocalHACluster brings up `skiff local up --servers 3 --agents 2`: five hosts, each a network namespace
// with its own address and iptables on a shared bridge, agents on the real runtime joined by retry_join to a
// single server and started before the servers. Then, with the stock kubectl:
//   - a pod on one agent reaches a pod on the other (pod CIDRs routed host-gw style);
//   - kill -9 an agent: Unknown with the unreachable taints; a pod tolerating that for 5 s is evicted; after
//     a restart the Node is Ready and untainted;
//   - partition an agent's host from the others, then heal it: the same sequence;
//   - partition the leader's host from the agents: no eviction (the disruption guard's case);
//   - kill -9 the Raft leader: the new leader marks no node unreachable;
//   - `skiff local down` leaves no namespace, veth or bridge behind.
func TestLocalHACluster(t *testing.T) {
	requireRealRuntime(t)
	dir, err := os.MkdirTemp("", "skiff-local-")
	if err != nil {
		t.Fatal(err)
	}
	bin := proctest.Binary(t)
	out, err := exec.Command(bin, "local", "up", "--servers", "3", "--agents", "2", "--dir", dir).CombinedOutput()
	st, loadErr := localcluster.Load(dir)
	t.Cleanup(func() {
		if t.Failed() && st != nil {
			for _, h := range st.Hosts {
				if data, err := os.ReadFile(h.Log); err == nil {
					t.Logf("--- %s log (tail) ---\n%s", h.Name, tailString(string(data), 3000))
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
	k := kubectl{t: t, kubeconfig: st.Kubeconfig(dir)}
	k.waitNodeHealth("agent-1", "True/", 60*time.Second)
	k.waitNodeHealth("agent-2", "True/", 60*time.Second)

	// Pods on different hosts reach each other: busybox httpd on agent-1, wget from agent-2.
	applyYAML(t, k, `apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  nodeName: agent-1
  tolerations:
  - {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 5}
  containers:
  - name: httpd
    image: skiff.local/busybox:1
    command: ["sh", "-c", "mkdir -p /www && echo hello-from-agent-1 > /www/index.html && httpd -f -p 8080 -h /www"]
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
    # busybox-static's wget crashes on Debian; nc speaks the HTTP it needs.
    command: ["sh", "-c", "printf 'GET /index.html HTTP/1.0\\r\\n\\r\\n' | nc -w 3 %s 8080 | grep hello-from-agent-1"]
`, webIP))
	proctest.WaitFor(t, "client on agent-2 fetched from web on agent-1", 90*time.Second, func() error {
		if s := k.podStatusColumn("client"); s != "Completed" {
			return fmt.Errorf("STATUS %s", s)
		}
		return nil
	})

	// kill -9 agent-1: Unknown, unreachable taints, web evicted after 5 s; restart: Ready, untainted.
	if err := st.Kill("agent-1"); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	k.waitNodeHealth("agent-1", "Unknown/NodeStatusUnknown node.kubernetes.io/unreachable", 60*time.Second)
	t.Logf("agent-1 marked unreachable %v after kill -9", time.Since(killed).Round(100*time.Millisecond))
	proctest.WaitFor(t, "web evicted", 30*time.Second, func() error {
		if out := k.ok("get", "pod", "web", "-o", "jsonpath={.metadata.deletionTimestamp}"); out == "" {
			return fmt.Errorf("not marked for deletion yet")
		}
		return nil
	})
	if err := st.Start(dir, "agent-1"); err != nil {
		t.Fatal(err)
	}
	k.waitNodeHealth("agent-1", "True/", 60*time.Second)
	proctest.WaitFor(t, "web's deletion confirmed by the restarted agent", 60*time.Second, func() error {
		if out, _ := k.run("get", "pod", "web"); !strings.Contains(out, "NotFound") {
			return fmt.Errorf("still there: %s", out)
		}
		return nil
	})

	// Partition agent-2's host from every other host, then heal it. (Cut off from the servers alone, it would
	// stay alive: gossip's indirect probes through agent-1 still reach it.)
	var others []string
	for _, h := range st.Hosts {
		if h.Name != "agent-2" {
			others = append(others, h.IP)
		}
	}
	if err := st.Partition("agent-2", others); err != nil {
		t.Fatal(err)
	}
	k.waitNodeHealth("agent-2", "Unknown/NodeStatusUnknown node.kubernetes.io/unreachable", 60*time.Second)
	if err := st.Heal("agent-2", others); err != nil {
		t.Fatal(err)
	}
	k.waitNodeHealth("agent-2", "True/", 60*time.Second)
	// Its pod ran through the partition and still runs once, with its first container.
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
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		for _, n := range []string{"agent-1", "agent-2"} {
			if got := k2.nodeHealth(n); strings.Contains(got, "Unknown") || strings.Contains(got, "unreachable") {
				t.Fatalf("after the leader's failover node %s is %q", n, got)
			}
		}
		time.Sleep(time.Second)
	}
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

func tailString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}
