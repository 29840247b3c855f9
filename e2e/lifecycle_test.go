package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/internal/proctest"

	"github.com/skiff-dev/skiff/internal/freeport"
)

// gossipAgent is a simulated `skiff agent` that joins the servers' gossip pool with retry_join and learns
// their API addresses from it: it has no `servers` list.
type gossipAgent struct {
	t      *testing.T
	name   string
	config string
	cmd    *exec.Cmd
	out    *syncBuilder
}

func newGossipAgent(t *testing.T, name string, join []string, port int) *gossipAgent {
	dir := t.TempDir()
	var quoted []string
	for _, j := range join {
		quoted = append(quoted, fmt.Sprintf("%q", j))
	}
	hcl := fmt.Sprintf(`name      = %q
data_dir  = %q
bind_addr = "127.0.0.1"
ports { gossip = %d }
agent {
  retry_join     = [%s]
  retry_interval = "500ms"
  token          = %q
  runtime        = "simulated"
}
`, name, filepath.Join(dir, "data"), port, strings.Join(quoted, ", "), joinToken)
	a := &gossipAgent{t: t, name: name, config: filepath.Join(dir, "agent.hcl"), out: &syncBuilder{}}
	if err := os.WriteFile(a.config, []byte(hcl), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		a.kill()
		if t.Failed() {
			t.Logf("agent %s output:\n%s", name, a.out.String())
		}
	})
	return a
}

func (a *gossipAgent) start() {
	a.cmd = exec.Command(proctest.Binary(a.t), "agent", "-config", a.config)
	a.cmd.Stdout, a.cmd.Stderr = a.out, a.out
	if err := a.cmd.Start(); err != nil {
		a.t.Fatal(err)
	}
}

func (a *gossipAgent) kill() {
	if a.cmd != nil && a.cmd.ProcessState == nil {
		a.cmd.Process.Kill()
		a.cmd.Wait()
	}
}

// stop is a graceful stop (SIGTERM): the agent leaves the pool.
func (a *gossipAgent) stop() {
	a.cmd.Process.Signal(syscall.SIGTERM)
	a.cmd.Wait()
}

// nodeHealth is a Node's Ready condition and taints, as kubectl shows them.
func (k kubectl) nodeHealth(name string) string {
	out, err := k.run("get", "node", name, "-o", `jsonpath={range .status.conditions[?(@.type=="Ready")]}{.status}/{.reason}{end} {.spec.taints[*].key}`)
	if err != nil {
		return "error: " + out
	}
	return out
}

func (k kubectl) waitNodeHealth(name, want string, timeout time.Duration) {
	k.t.Helper()
	proctest.WaitFor(k.t, fmt.Sprintf("node %s: %s", name, want), timeout, func() error {
		if got := k.nodeHealth(name); !strings.HasPrefix(got, want) || (!strings.Contains(want, "node.kubernetes.io") && strings.Contains(got, "node.kubernetes.io")) {
			return fmt.Errorf("got %q", got)
		}
		return nil
	})
}

// TestNodeLifecycleByGossip runs three servers and two agents that join by retry_join only (started before
// the servers exist), and checks the node lifecycle of issue 6 with the stock kubectl:
//   - kill -9 an agent: its Node goes Ready=Unknown with the unreachable taints; a pod tolerating them for 5 s
//     is evicted, one with the default 300 s is not;
//   - restart it: the Node is Ready again and the taints are gone; the evicted pod's deletion is confirmed;
//   - SIGTERM an agent: its Node goes Ready=False, NodeShutdown, with the not-ready taints;
//   - kill -9 the Raft leader: the new leader marks no live node unreachable;
//   - a Node with a Lease and no gossip member goes Unknown once the Lease is older than node_lease_grace.
func TestNodeLifecycleByGossip(t *testing.T) {
	parallel(t)
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Skip("kubectl not installed")
	}
	c := proctest.NewCluster(t, 3, fmt.Sprintf("token = %q\n  node_lease_grace = \"5s\"", joinToken))
	var joins []string
	for _, p := range c.Procs {
		joins = append(joins, p.GossipAddr)
	}
	ports := freeport.Take(t, []string{"127.0.0.1"}, 2)
	// Agents first: they keep trying to join until the servers are there.
	ga := newGossipAgent(t, "ga", joins[:1], ports[0])
	gb := newGossipAgent(t, "gb", joins[1:2], ports[1])
	ga.start()
	gb.start()
	time.Sleep(time.Second)
	for _, p := range c.Procs {
		c.Start(p)
	}
	k := kubectl{t: t, kubeconfig: c.Procs[0].Kubeconfig()}
	k.waitForAPI("default")
	k.waitNodeHealth("ga", "True/", 60*time.Second)
	k.waitNodeHealth("gb", "True/", 60*time.Second)

	// Two pods on ga: one tolerating its loss for 5 s, one with the default (300 s, added by admission).
	applyYAML(t, k, `apiVersion: v1
kind: Pod
metadata: {name: brief}
spec:
  nodeName: ga
  tolerations:
  - {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 5}
  containers: [{name: c, image: registry.local/app:1}]
---
apiVersion: v1
kind: Pod
metadata: {name: patient}
spec:
  nodeName: ga
  containers: [{name: c, image: registry.local/app:1}]
`)
	mustContain(t, "default tolerations", k.ok("get", "pod", "patient", "-o", "jsonpath={.spec.tolerations}"),
		`"key":"node.kubernetes.io/unreachable"`, `"tolerationSeconds":300`, `"key":"node.kubernetes.io/not-ready"`)
	proctest.WaitFor(t, "both pods Running", 30*time.Second, func() error {
		if out := k.ok("get", "pods", "--no-headers"); strings.Count(out, "Running") != 2 {
			return fmt.Errorf("not yet:\n%s", out)
		}
		return nil
	})

	// kill -9 ga: Unknown, unreachable taints, brief evicted after 5 s, patient kept.
	killed := time.Now()
	ga.kill()
	k.waitNodeHealth("ga", "Unknown/NodeStatusUnknown node.kubernetes.io/unreachable node.kubernetes.io/unreachable", 30*time.Second)
	t.Logf("ga marked unreachable %v after kill -9", time.Since(killed).Round(100*time.Millisecond))
	// The node lifecycle controller marks the node's pods not ready after the node itself: a write later.
	proctest.WaitFor(t, "patient's Ready condition False", 10*time.Second, func() error {
		if out := k.ok("get", "pod", "patient", "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`); out != "False" {
			return fmt.Errorf("Ready is %q", out)
		}
		return nil
	})
	proctest.WaitFor(t, "brief evicted", 30*time.Second, func() error {
		if out := k.ok("get", "pod", "brief", "-o", "jsonpath={.metadata.deletionTimestamp}"); out == "" {
			return fmt.Errorf("not marked for deletion yet")
		}
		return nil
	})
	if out := k.ok("get", "pod", "patient", "-o", "jsonpath={.metadata.deletionTimestamp}"); out != "" {
		t.Fatalf("patient, tolerating for 300 s, was evicted at %s", out)
	}
	mustContain(t, "eviction event", k.ok("get", "events", "--field-selector", "involvedObject.name=brief"), "TaintManagerEviction")

	// Restart ga: Ready, no taints; its agent confirms brief's deletion.
	ga.start()
	k.waitNodeHealth("ga", "True/", 30*time.Second)
	proctest.WaitFor(t, "brief gone", 30*time.Second, func() error {
		if out, _ := k.run("get", "pod", "brief"); !strings.Contains(out, "NotFound") {
			return fmt.Errorf("still there: %s", out)
		}
		return nil
	})

	// kill -9 the Raft leader: the new leader keeps ga and gb Ready and does not evict.
	leader := c.HealthyPeers(c.Procs[0], 3)
	c.Kill(c.ByName(leader))
	var survivor *proctest.Proc
	for _, p := range c.Procs {
		if p.Name != leader {
			survivor = p
			break
		}
	}
	k2 := kubectl{t: t, kubeconfig: survivor.Kubeconfig()}
	c.HealthyPeers(survivor, 3) // a leader again (the dead peer is still a voter)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		for _, n := range []string{"ga", "gb"} {
			if got := k2.nodeHealth(n); !strings.HasPrefix(got, "True/") {
				t.Fatalf("after the leader's failover node %s is %q", n, got)
			}
		}
		time.Sleep(500 * time.Millisecond)
	}

	// SIGTERM gb: it leaves the pool, and its Node is shut down, not unreachable.
	gb.stop()
	k2.waitNodeHealth("gb", "False/NodeShutdown node.kubernetes.io/not-ready", 30*time.Second)

	// The Lease path: a Node that no member hosts, with a Lease that stops being renewed.
	now := time.Now().UTC().Format("2006-01-02T15:04:05.000000Z")
	applyYAML(t, k2, fmt.Sprintf(`apiVersion: v1
kind: Node
metadata: {name: leased}
---
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata: {name: leased, namespace: kube-node-lease}
spec: {holderIdentity: leased, leaseDurationSeconds: 40, renewTime: "%s"}
`, now))
	k2.waitNodeHealth("leased", "True/", 30*time.Second)
	k2.waitNodeHealth("leased", "Unknown/NodeStatusUnknown node.kubernetes.io/unreachable", 30*time.Second)
}
