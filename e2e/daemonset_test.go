package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/skiff-dev/skiff/internal/proctest"
)

const daemonSetManifest = `apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: %[1]s
spec:
  selector:
    matchLabels: {app: %[1]s}
  minReadySeconds: 2
  template:
    metadata:
      labels: {app: %[1]s}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: agent
        image: registry.local/agent:1
%[2]s`

// podsOnNodes is "node=phase" of each live pod with the label, sorted.
func podsOnNodes(k kubectl, label string) string {
	out := k.ok("get", "pods", "-l", label, "-o",
		`jsonpath={range .items[?(@.metadata.deletionTimestamp)]}X{end}{range .items[*]}{.spec.nodeName}={.status.phase}{"\n"}{end}`)
	if strings.HasPrefix(out, "X") {
		return "terminating pods: " + out
	}
	lines := strings.Fields(out)
	sort.Strings(lines)
	return strings.Join(lines, " ")
}

// unavailableNodes watches the pods with the label and records the most nodes (of those given) that at
// one moment had no Running pod that is not being deleted.
type unavailableNodes struct {
	mu    sync.Mutex
	worst int
	stop  func()
	done  chan struct{}
}

func watchUnavailable(t *testing.T, c kubernetes.Interface, label string, nodes []string) *unavailableNodes {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	list, err := c.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: label})
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.CoreV1().Pods("default").Watch(ctx, metav1.ListOptions{LabelSelector: label, ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	u := &unavailableNodes{stop: func() { cancel(); w.Stop() }, done: make(chan struct{})}
	t.Cleanup(func() { u.stop(); <-u.done })
	live := map[string]corev1.Pod{}
	for _, p := range list.Items {
		live[p.Name] = p
	}
	go func() {
		defer close(u.done)
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			if ev.Type == watch.Deleted || p.DeletionTimestamp != nil {
				delete(live, p.Name)
			} else {
				live[p.Name] = *p
			}
			running := map[string]bool{}
			for _, p := range live {
				if p.Status.Phase == corev1.PodRunning {
					running[p.Spec.NodeName] = true
				}
			}
			missing := 0
			for _, n := range nodes {
				if !running[n] {
					missing++
				}
			}
			u.mu.Lock()
			u.worst = max(u.worst, missing)
			u.mu.Unlock()
		}
	}()
	return u
}

// result stops the watch and returns the worst count.
func (u *unavailableNodes) result() int {
	u.stop()
	<-u.done
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.worst
}

// simulatedCluster starts one server process and a simulated agent hosting nodes nodes (2 CPUs, 4 GiB each),
// and waits until the nodes are Ready and the default service account exists; it skips without kubectl.
func simulatedCluster(t *testing.T, nodes int) kubectl {
	t.Helper()
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Skip("kubectl not installed")
	}
	c := proctest.NewCluster(t, 1, fmt.Sprintf("token = %q", joinToken))
	c.Start(c.Procs[0])
	k := kubectl{t: t, kubeconfig: c.Procs[0].Kubeconfig()}
	k.waitForAPI("default")
	startAgent(t, "sim", apiAddr(t, k.kubeconfig), joinToken, fmt.Sprintf(`  runtime = "simulated"
  simulated {
    nodes      = %d
    cpu        = "2"
    memory     = "4Gi"
    kubeconfig = %q
  }`, nodes, k.kubeconfig))
	proctest.WaitFor(t, fmt.Sprintf("%d Ready nodes", nodes), 60*time.Second, func() error {
		if out := k.ok("get", "nodes", "--no-headers"); strings.Count(out, " Ready ") != nodes {
			return fmt.Errorf("not yet:\n%s", out)
		}
		return nil
	})
	proctest.WaitFor(t, "the default service account", 30*time.Second, func() error {
		_, err := k.run("get", "serviceaccount", "default")
		return err
	})
	return k
}

// TestDaemonSetOnSimulatedNodes runs a server process and a simulated agent hosting three nodes, and drives
// DaemonSets with the stock kubectl: one Running pod on each node; a tainted node gets none unless the
// DaemonSet tolerates the taint; `kubectl set image` rolls the pods one node at a time, which `kubectl
// rollout status` follows; `kubectl rollout history` lists the ControllerRevisions and `kubectl rollout
// undo` goes back to the first template.
func TestDaemonSetOnSimulatedNodes(t *testing.T) {
	parallel(t)
	k := simulatedCluster(t, 3)
	k.ok("taint", "node", "sim-2", "dedicated=infra:NoSchedule")
	dir := t.TempDir()
	apply := func(name, extra string) {
		path := filepath.Join(dir, name+".yaml")
		if err := os.WriteFile(path, []byte(fmt.Sprintf(daemonSetManifest, name, extra)), 0o600); err != nil {
			t.Fatal(err)
		}
		mustContain(t, "apply", k.ok("apply", "-f", path), "daemonset.apps/"+name+" created")
	}
	apply("agent", "")
	apply("tolerant", `      tolerations:
      - {key: dedicated, operator: Equal, value: infra, effect: NoSchedule}
`)
	waitPods := func(label, want string) {
		t.Helper()
		proctest.WaitFor(t, label+" pods on "+want, 60*time.Second, func() error {
			if got := podsOnNodes(k, label); got != want {
				return fmt.Errorf("pods: %s", got)
			}
			return nil
		})
	}
	waitPods("app=agent", "sim-0=Running sim-1=Running")
	waitPods("app=tolerant", "sim-0=Running sim-1=Running sim-2=Running")
	mustContain(t, "rollout status", k.ok("rollout", "status", "ds/agent", "--timeout=60s"), `daemon set "agent" successfully rolled out`)
	out := k.ok("get", "ds", "agent")
	mustContain(t, "get ds", out, "DESIRED", "UP-TO-DATE", "NODE SELECTOR")
	if fields := strings.Fields(strings.Split(strings.TrimSpace(out), "\n")[1]); len(fields) < 6 || strings.Join(fields[1:6], " ") != "2 2 2 2 2" {
		t.Fatalf("get ds agent: want 2 desired, current, ready, up-to-date, available:\n%s", out)
	}

	mustContain(t, "get ds -o wide", k.ok("get", "ds", "tolerant", "-o", "wide"), "CONTAINERS", "IMAGES", "registry.local/agent:1", "app=tolerant")
	mustContain(t, "describe ds", k.ok("describe", "ds", "agent"), "Desired Number of Nodes Scheduled: 2",
		"Pods Status:  2 Running / 0 Waiting / 0 Succeeded / 0 Failed", "SuccessfulCreate")
	// The controller acts as its service account, bound to Kubernetes' role for it.
	mustContain(t, "controller role binding", k.ok("get", "clusterrolebinding", "system:controller:daemon-set-controller", "-o",
		"jsonpath={.roleRef.name} {.subjects[0].namespace}/{.subjects[0].name}"),
		"system:controller:daemon-set-controller kube-system/daemon-set-controller")
	mustContain(t, "controller identity", k.ok("auth", "can-i", "create", "pods", "--as=system:serviceaccount:kube-system:daemon-set-controller"), "yes")

	// kubectl set image: the pods are replaced one node at a time (maxUnavailable 1, each new pod
	// available only after minReadySeconds).
	cfg, err := clientcmd.BuildConfigFromFlags("", k.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	client := kubernetes.NewForConfigOrDie(cfg)
	roll := func(what string, change ...string) {
		t.Helper()
		u := watchUnavailable(t, client, "app=tolerant", []string{"sim-0", "sim-1", "sim-2"})
		start := time.Now()
		k.ok(change...)
		mustContain(t, what+": rollout status", k.ok("rollout", "status", "ds/tolerant", "--timeout=90s"), `daemon set "tolerant" successfully rolled out`)
		took := time.Since(start)
		if worst := u.result(); worst != 1 {
			t.Fatalf("%s: at worst %d of 3 nodes had no Running pod during the rollout, want 1 (one at a time)", what, worst)
		}
		// Three nodes one after the other, each new pod available after 2 s: at least 4 s.
		if took < 4*time.Second {
			t.Fatalf("%s: the rollout took %v, too fast for one node at a time", what, took)
		}
		waitPods("app=tolerant", "sim-0=Running sim-1=Running sim-2=Running")
	}
	roll("set image", "set", "image", "ds/tolerant", "agent=registry.local/agent:2")
	mustContain(t, "images", k.ok("get", "pods", "-l", "app=tolerant", "-o", "jsonpath={.items[*].spec.containers[0].image}"),
		"registry.local/agent:2")
	if out := k.ok("get", "pods", "-l", "app=tolerant", "-o", "jsonpath={.items[*].spec.containers[0].image}"); strings.Contains(out, "agent:1") {
		t.Fatalf("old image left after the rollout: %s", out)
	}

	// History: a ControllerRevision per template.
	out = k.ok("rollout", "history", "ds/tolerant")
	mustContain(t, "rollout history", out, "REVISION", "1 ", "2 ")
	mustContain(t, "rollout history --revision=2", k.ok("rollout", "history", "ds/tolerant", "--revision=2"), "registry.local/agent:2")
	mustContain(t, "controllerrevisions", k.ok("get", "controllerrevisions", "-l", "app=tolerant"), "daemonset.apps/tolerant")

	// Undo: back to revision 1's template, rolled out the same way; the old revision is renumbered 3.
	roll("rollout undo", "rollout", "undo", "ds/tolerant")
	if out := k.ok("get", "pods", "-l", "app=tolerant", "-o", "jsonpath={.items[*].spec.containers[0].image}"); strings.Contains(out, "agent:2") ||
		!strings.Contains(out, "agent:1") {
		t.Fatalf("images after rollout undo: %s", out)
	}
	out = k.ok("rollout", "history", "ds/tolerant")
	if !strings.Contains(out, "2 ") || !strings.Contains(out, "3 ") || strings.Contains(out, "\n1 ") {
		t.Fatalf("rollout history after undo, want revisions 2 and 3:\n%s", out)
	}
	// The untolerated node still has none of agent's pods, and removing the taint gives it one.
	waitPods("app=agent", "sim-0=Running sim-1=Running")
	k.ok("taint", "node", "sim-2", "dedicated=infra:NoSchedule-")
	waitPods("app=agent", "sim-0=Running sim-1=Running sim-2=Running")
}
