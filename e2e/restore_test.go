package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/internal/testimages"
)

// TestDisasterRestore: a Deployment runs on a real agent under three servers; a snapshot is saved (with the
// servers' encryption configuration beside it), and a pod created after it. Then every server is destroyed
// with its data dir, and the agent is killed and loses its
// state (certificates, gossip peers, keyring), keeping only its containers. The snapshot is restored into
// three new servers at new addresses; the servers restart to take the restored cluster's identity, and the
// agent, pointed at them, joins again. The Deployment's pods run again with the same containers, without
// duplicates, and the pod the snapshot never held is removed from the agent.
func TestDisasterRestore(t *testing.T) {
	parallelOnHostNetwork(t)
	requireRealRuntime(t)
	registry := testimages.StartRegistry(t)
	images := testimages.Push(t, registry)
	old := proctest.NewCluster(t, 3, fmt.Sprintf("token = %q", joinToken))
	for _, p := range old.Procs {
		old.Start(p)
	}
	old.HealthyPeers(old.Procs[0], 3)
	k := kubectl{t: t, kubeconfig: old.Procs[0].Kubeconfig()}
	k.waitForAPI("default")
	agent := newRealAgent(t, apiAddr(t, old.Procs[0].Kubeconfig()), registry)
	agent.start()
	waitNodeReady(t, k, agent.name)
	applyYAML(t, k, fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
      - name: server
        image: %s
        readinessProbe:
          httpGet: {path: /ready, port: 8080}
          periodSeconds: 1
`, images.Server))
	before := waitReadyPods(t, k, "app=web", 2)

	snap := filepath.Join(t.TempDir(), "backup.snap")
	if out, err := old.Operator(old.Procs[0], "snapshot", "save", snap); err != nil {
		t.Fatalf("snapshot save: %v\n%s", err, out)
	}
	applyYAML(t, k, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: after, labels: {app: after}}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - {name: server, image: %s}
`, images.Server))
	after := waitReadyPods(t, k, "app=after", 1)

	// The disaster: all servers gone with their data; the agent killed, its state lost but its containers.
	oldAddr := apiAddr(t, old.Procs[0].Kubeconfig())
	oldKubeconfig, err := os.ReadFile(old.Procs[0].Kubeconfig())
	if err != nil {
		t.Fatal(err)
	}
	// The snapshot's secrets are encrypted with the old cluster's key: its encryption configuration is
	// backed up beside the snapshot, and given to the new servers.
	oldEncryption, err := os.ReadFile(filepath.Join(old.Procs[0].Dir, "encryption-config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range old.Procs {
		old.Kill(p)
		if err := os.RemoveAll(p.Dir); err != nil {
			t.Fatal(err)
		}
	}
	agent.kill()
	entries, err := os.ReadDir(agent.dataDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		// What keeps running: containerd's store, the pods' directories and their network (IPAM, CNI cache),
		// and the node's DNS process, which a restarted agent adopts from its directory.
		if !slices.Contains([]string{"containerd", "pods", "cni", "pod-cidr", "dns"}, e.Name()) {
			if err := os.RemoveAll(filepath.Join(agent.dataDir, e.Name())); err != nil {
				t.Fatal(err)
			}
		}
	}

	// Three new servers at new addresses, then the restore.
	fresh := proctest.NewClusterFrom(t, 4, 3, fmt.Sprintf("token = %q", joinToken))
	for _, p := range fresh.Procs {
		if err := os.MkdirAll(p.Dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(p.Dir, "encryption-config.yaml"), oldEncryption, 0o600); err != nil {
			t.Fatal(err)
		}
		fresh.Start(p)
	}
	fresh.HealthyPeers(fresh.Procs[0], 3)
	kubectl{t: t, kubeconfig: fresh.Procs[0].Kubeconfig()}.waitForAPI("default")
	out, err := fresh.Operator(fresh.Procs[0], "snapshot", "restore", snap)
	if err != nil {
		t.Fatalf("snapshot restore: %v\n%s", err, out)
	}
	mustContain(t, "the restore's advice", out, "restart each server")
	for _, p := range fresh.Procs {
		if err := fresh.Stop(p); err != nil {
			t.Fatal(err)
		}
		fresh.Start(p)
		fresh.HealthyPeers(p, 3)
	}

	// The old admin kubeconfig, pointed at a new server, works again: the restored cluster's CA is back.
	newAddr := apiAddr(t, fresh.Procs[0].Kubeconfig())
	repointed := filepath.Join(t.TempDir(), "old-admin.kubeconfig")
	if err := os.WriteFile(repointed, []byte(strings.Replace(string(oldKubeconfig), oldAddr, newAddr, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	kubectl{t: t, kubeconfig: repointed}.waitForAPI("default")
	k2 := kubectl{t: t, kubeconfig: fresh.Procs[1].Kubeconfig()}
	k2.waitForAPI("default")

	// The agent joins the new servers.
	hcl, err := os.ReadFile(agent.config)
	if err != nil {
		t.Fatal(err)
	}
	newHCL := strings.Replace(string(hcl), oldAddr, newAddr, 1)
	if err := os.WriteFile(agent.config, []byte(newHCL), 0o600); err != nil {
		t.Fatal(err)
	}
	agent.start()
	waitNodeReady(t, k2, agent.name)
	restored := waitReadyPods(t, k2, "app=web", 2)
	for name, id := range before {
		if restored[name] != id {
			t.Errorf("pod %s runs container %q after the restore, %q before: want the same container adopted", name, restored[name], id)
		}
	}
	// The pod the snapshot never held is removed from the agent, and nothing runs twice: the agent's tasks
	// are exactly a sandbox and a container for each restored pod.
	var want []string
	for name := range restored {
		uid := k2.ok("get", "pod", name, "-o", "jsonpath={.metadata.uid}")
		want = append(want, uid+"-sandbox", uid+"-app-server-0")
	}
	slices.Sort(want)
	proctest.WaitFor(t, "the agent running exactly the restored pods", 60*time.Second, func() error {
		var running []string
		for _, line := range strings.Split(ctr(t, agent, "tasks", "list"), "\n") {
			if f := strings.Fields(line); len(f) == 3 && f[2] == "RUNNING" {
				running = append(running, f[0])
			}
		}
		slices.Sort(running)
		if !slices.Equal(running, want) {
			return fmt.Errorf("running tasks %v, want %v (the pod %s had containers %v)", running, want, "after", after)
		}
		return nil
	})
}

// waitNodeReady waits for a Node to be Ready.
func waitNodeReady(t *testing.T, k kubectl, name string) {
	t.Helper()
	proctest.WaitFor(t, "node "+name+" Ready", 90*time.Second, func() error {
		if out, err := k.run("get", "node", name, "--no-headers"); err != nil || !strings.Contains(out, " Ready ") {
			return fmt.Errorf("not yet: %s %v", out, err)
		}
		return nil
	})
}

// waitReadyPods waits until exactly n pods match the selector, each Running and Ready, and returns their
// container IDs by pod name.
func waitReadyPods(t *testing.T, k kubectl, selector string, n int) map[string]string {
	t.Helper()
	var ids map[string]string
	proctest.WaitFor(t, fmt.Sprintf("%d ready pods %s", n, selector), 120*time.Second, func() error {
		out, err := k.run("get", "pods", "-l", selector, "-o",
			`jsonpath={range .items[*]}{.metadata.name} {.status.phase} {.status.containerStatuses[0].ready} {.status.containerStatuses[0].containerID}{"\n"}{end}`)
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		ids = map[string]string{}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			f := strings.Fields(line)
			if len(f) != 4 || f[1] != "Running" || f[2] != "true" {
				return fmt.Errorf("not yet: %s", out)
			}
			ids[f[0]] = f[3]
		}
		if len(ids) != n {
			return fmt.Errorf("%d pods, want %d: %s", len(ids), n, out)
		}
		return nil
	})
	return ids
}
