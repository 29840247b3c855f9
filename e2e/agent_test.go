package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/internal/proctest"
)

const joinToken = "e2e-join-token-0123456789"

// startAgent runs `skiff agent` from generated HCL and stops it at cleanup. It returns the process and its
// combined output so far.
func startAgent(t *testing.T, name, server, token, agentBody string) (*exec.Cmd, *strings.Builder) {
	dir := t.TempDir()
	hcl := fmt.Sprintf(`name      = %q
data_dir  = %q
bind_addr = "127.0.0.1"
log_level = "info"
agent {
  servers = [%q]
  token   = %q
%s
}
`, name, filepath.Join(dir, "data"), server, token, agentBody)
	path := filepath.Join(dir, "agent.hcl")
	if err := os.WriteFile(path, []byte(hcl), 0o600); err != nil {
		t.Fatal(err)
	}
	out := &strings.Builder{}
	cmd := exec.Command(proctest.Binary(t), "agent", "-config", path)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("agent %s output:\n%s", name, out.String())
		}
	})
	return cmd, out
}

// TestSimulatedAgentRunsPods starts a server with a join token and a simulated agent hosting three nodes,
// then drives a pod through its whole life with the stock kubectl: scheduled to an agent's node, Running and
// Ready, deleted gracefully and confirmed by the agent. An agent with a wrong token stops with a clear error.
func TestSimulatedAgentRunsPods(t *testing.T) {
	parallel(t)
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Skip("kubectl not installed")
	}
	c := proctest.NewCluster(t, 1, fmt.Sprintf("token = %q", joinToken))
	c.Start(c.Procs[0])
	k := kubectl{t: t, kubeconfig: c.Procs[0].Kubeconfig()}
	k.waitForAPI("default")
	server := apiAddr(t, c.Procs[0].Kubeconfig())

	// A wrong token: the CA check fails and the agent stops with a clear error.
	bad, badOut := startAgent(t, "intruder", server, "not-the-join-token-at-all", `runtime = "simulated"`)
	done := make(chan error, 1)
	go func() { done <- bad.Wait() }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(badOut.String(), "does not match the join token") {
			t.Fatalf("agent with a wrong token: exit %v, output:\n%s", err, badOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("agent with a wrong token still running:\n%s", badOut.String())
	}

	startAgent(t, "sim", server, joinToken, fmt.Sprintf(`  runtime = "simulated"
  node_labels = { "disktype" = "ssd" }
  node_taints = ["dedicated=infra:PreferNoSchedule"]
  simulated {
    nodes  = 3
    cpu    = "2"
    memory = "4Gi"
    labels = { "topology.kubernetes.io/zone" = "zone-%%d" }
    zones  = 3
    kubeconfig = %q
  }`, c.Procs[0].Kubeconfig()))
	proctest.WaitFor(t, "three Ready nodes", 60*time.Second, func() error {
		out := k.ok("get", "nodes", "-l", "disktype=ssd", "--no-headers")
		if strings.Count(out, " Ready ") != 3 {
			return fmt.Errorf("not yet:\n%s", out)
		}
		return nil
	})
	// `skiff operator token rotate` revokes the token the agents joined with: an agent that presents it now
	// stops, with no certificate; the running agent keeps its own.
	rotated, err := c.Operator(c.Procs[0], "token", "rotate")
	if err != nil || !strings.HasPrefix(rotated, "K10") {
		t.Fatalf("skiff operator token rotate: %q, %v", rotated, err)
	}
	late, lateOut := startAgent(t, "late", server, joinToken, `runtime = "simulated"`)
	lateDone := make(chan error, 1)
	go func() { lateDone <- late.Wait() }()
	select {
	case err := <-lateDone:
		if err == nil || !strings.Contains(lateOut.String(), "does not match the join token") {
			t.Fatalf("agent with the revoked token: exit %v, output:\n%s", err, lateOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("agent with the revoked token still running:\n%s", lateOut.String())
	}
	if out := k.ok("get", "csr", "-o", "jsonpath={.items[*].spec.username}"); strings.Contains(out, "late") {
		t.Fatalf("the revoked token got a CSR in: %s", out)
	}
	mustContain(t, "node labels", k.ok("get", "node", "sim-2", "-o", "jsonpath={.metadata.labels}"), `"topology.kubernetes.io/zone":"zone-2"`, `"kubernetes.io/hostname":"sim-2"`)
	mustContain(t, "node taints", k.ok("get", "node", "sim-0", "-o", "jsonpath={.spec.taints}"), "dedicated", "PreferNoSchedule")
	mustContain(t, "node info", k.ok("get", "node", "sim-0", "-o", "jsonpath={.status.nodeInfo.containerRuntimeVersion} {.status.capacity.cpu}"), "simulated://1 2")

	k.ok("run", "web", "--image=registry.local/web:1", "--restart=Never")
	proctest.WaitFor(t, "web Running and Ready", 60*time.Second, func() error {
		out := k.ok("get", "pod", "web", "--no-headers")
		if !strings.Contains(out, "1/1") || !strings.Contains(out, "Running") {
			return fmt.Errorf("not yet: %s", out)
		}
		return nil
	})
	mustContain(t, "pod conditions", k.ok("get", "pod", "web", "-o", `jsonpath={range .status.conditions[*]}{.type}={.status} {end}`),
		"PodScheduled=True", "Initialized=True", "ContainersReady=True", "Ready=True", "PodReadyToStartContainers=True")
	mustContain(t, "pod node", k.ok("get", "pod", "web", "-o", "jsonpath={.spec.nodeName} {.status.hostIP}"), "sim-", "127.0.0.1")
	// The pod's IP comes from its node's pod CIDR, which the control plane assigned at registration.
	var nodeName, podIP string
	fmt.Sscan(k.ok("get", "pod", "web", "-o", "jsonpath={.spec.nodeName} {.status.podIP}"), &nodeName, &podIP)
	podCIDR := k.ok("get", "node", nodeName, "-o", "jsonpath={.spec.podCIDR}")
	if _, cidr, err := net.ParseCIDR(podCIDR); err != nil || !cidr.Contains(net.ParseIP(podIP)) || !strings.HasPrefix(podCIDR, "10.244.") {
		t.Fatalf("pod IP %q on %s, whose pod CIDR is %q", podIP, nodeName, podCIDR)
	}

	// A bound pod is removed only when its agent confirms the graceful delete; without the agent this delete
	// would wait forever and the context would end it.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "kubectl", "--kubeconfig", k.kubeconfig, "delete", "pod", "web", "--wait=true").CombinedOutput(); err != nil {
		t.Fatalf("kubectl delete: %v\n%s", err, out)
	}
	if out, _ := k.run("get", "pod", "web"); !strings.Contains(out, "NotFound") {
		t.Fatalf("pod still there after delete:\n%s", out)
	}
}
