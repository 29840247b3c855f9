package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/internal/proctest"
)

const budgetedDeployment = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 3
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: web
        image: registry.local/web:1
`

// otherBudget covers pods of another app, so it does not hold the drain back.
const otherBudget = `apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: other
spec:
  maxUnavailable: 1
  selector:
    matchLabels: {app: other}
`

// TestDrainHonoursDisruptionBudget runs a server process and a simulated agent hosting one node with three
// Ready pods of a Deployment, and a budget made with `kubectl create pdb --min-available=2`: `kubectl get
// pdb` and `describe pdb` show the disruption controller's status (one disruption allowed), and `kubectl
// drain` evicts one pod only, reporting the budget for the others until its timeout.
func TestDrainHonoursDisruptionBudget(t *testing.T) {
	parallel(t)
	k := simulatedCluster(t, 1)
	path := filepath.Join(t.TempDir(), "web.yaml")
	if err := os.WriteFile(path, []byte(budgetedDeployment), 0o600); err != nil {
		t.Fatal(err)
	}
	k.ok("apply", "-f", path)
	mustContain(t, "create pdb", k.ok("create", "pdb", "web", "--selector=app=web", "--min-available=2"),
		"poddisruptionbudget.policy/web created")
	proctest.WaitFor(t, "three Running pods", 60*time.Second, func() error {
		if got := podsOnNodes(k, "app=web"); got != "sim=Running sim=Running sim=Running" {
			return fmt.Errorf("pods: %s", got)
		}
		return nil
	})
	proctest.WaitFor(t, "the budget's status", 30*time.Second, func() error {
		out := k.ok("get", "pdb", "web", "-o", "jsonpath={.status.currentHealthy} {.status.desiredHealthy} {.status.disruptionsAllowed}")
		if out != "3 2 1" {
			return fmt.Errorf("healthy, desired, allowed: %s", out)
		}
		return nil
	})
	out := k.ok("get", "pdb")
	mustContain(t, "get pdb", out, "MIN AVAILABLE", "MAX UNAVAILABLE", "ALLOWED DISRUPTIONS")
	if !regexp.MustCompile(`(?m)^web\s+2\s+N/A\s+1\s`).MatchString(out) {
		t.Fatalf("get pdb: want web with min available 2, max unavailable N/A, 1 allowed:\n%s", out)
	}
	mustContain(t, "describe pdb", k.ok("describe", "pdb", "web"), "Min available:  2", "Selector:       app=web",
		"Allowed disruptions:  1", "Current:              3", "Desired:              2", "Total:                3")
	// The OpenAPI covers policy/v1: kubectl explains budgets, and server-side apply types them.
	mustContain(t, "explain pdb", k.ok("explain", "pdb.spec.unhealthyPodEvictionPolicy"), "IfHealthyBudget", "AlwaysAllow")
	other := filepath.Join(t.TempDir(), "other.yaml")
	if err := os.WriteFile(other, []byte(otherBudget), 0o600); err != nil {
		t.Fatal(err)
	}
	mustContain(t, "apply --server-side", k.ok("apply", "--server-side", "-f", other), "poddisruptionbudget.policy/other serverside-applied")
	mustContain(t, "get pdb other", k.ok("get", "pdb", "other", "-o", "jsonpath={.spec.maxUnavailable}"), "1")

	start := time.Now()
	out = k.fails("drain", "sim", "--ignore-daemonsets", "--delete-emptydir-data", "--timeout=20s")
	t.Logf("kubectl drain (%v):\n%s", time.Since(start).Round(time.Second), out)
	mustContain(t, "drain", out, "node/sim cordoned", "Cannot evict pod as it would violate the pod's disruption budget.")
	if n := len(regexp.MustCompile(`(?m)^pod/web-\S+ evicted$`).FindAllString(out, -1)); n != 1 {
		t.Fatalf("drain evicted %d pods, want 1:\n%s", n, out)
	}
	// Two pods still run on the cordoned node; the Deployment's replacement waits, unschedulable.
	if got := podsOnNodes(k, "app=web"); got != "=Pending sim=Running sim=Running" {
		t.Fatalf("after drain, pods: %s", got)
	}
	mustContain(t, "budget after drain", k.ok("get", "pdb", "web", "-o",
		"jsonpath={.status.currentHealthy} {.status.desiredHealthy} {.status.disruptionsAllowed}"), "2 2 0")
}
