package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/skiff-dev/skiff/internal/proctest"
)

const statefulSetManifest = `apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  clusterIP: None
  selector: {app: web}
  ports:
  - {port: 80, name: http}
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: web
spec:
  serviceName: web
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

// TestStatefulSetOnSimulatedNodes runs a server process and a simulated agent, and drives a StatefulSet of 3
// behind a headless Service with the stock kubectl: web-0, web-1 and web-2 come up in order, each Running and
// Ready before the next is created; `kubectl delete pod web-1` brings back a new web-1; `kubectl set image`
// rolls the pods (highest ordinal first), which `kubectl rollout status` follows; `kubectl rollout history`
// lists the revisions and `kubectl rollout undo` goes back to the first template; `kubectl scale` to 2
// removes web-2.
func TestStatefulSetOnSimulatedNodes(t *testing.T) {
	parallel(t)
	k := simulatedCluster(t, 2)
	cfg, err := clientcmd.BuildConfigFromFlags("", k.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	client := kubernetes.NewForConfigOrDie(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Watch the pods from before the StatefulSet exists: each is created only once the ones before it are
	// Running and Ready.
	w, err := client.CoreV1().Pods("default").Watch(ctx, metav1.ListOptions{LabelSelector: "app=web"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	path := filepath.Join(t.TempDir(), "web.yaml")
	if err := os.WriteFile(path, []byte(statefulSetManifest), 0o600); err != nil {
		t.Fatal(err)
	}
	mustContain(t, "apply", k.ok("apply", "-f", path), "service/web created", "statefulset.apps/web created")
	var created []string
	ready := map[string]bool{}
	timeout := time.After(60 * time.Second)
	for len(created) < 3 || !ready["web-2"] {
		select {
		case ev := <-w.ResultChan():
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			if ev.Type == watch.Added {
				created = append(created, p.Name)
				for _, before := range created[:len(created)-1] {
					if !ready[before] {
						t.Errorf("%s created while %s was not Running and Ready", p.Name, before)
					}
				}
			}
			ready[p.Name] = p.Status.Phase == corev1.PodRunning && slices.ContainsFunc(p.Status.Conditions, func(c corev1.PodCondition) bool {
				return c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue
			})
		case <-timeout:
			t.Fatalf("pods created: %v, ready: %v", created, ready)
		}
	}
	w.Stop()
	if !slices.Equal(created, []string{"web-0", "web-1", "web-2"}) {
		t.Fatalf("pods created in the order %v, want web-0, web-1, web-2", created)
	}
	mustContain(t, "rollout status", k.ok("rollout", "status", "sts/web", "--timeout=60s"), "partitioned roll out complete: 3 new pods have been updated")
	out := k.ok("get", "sts", "web")
	mustContain(t, "get sts", out, "READY", "3/3")
	mustContain(t, "get sts -o wide", k.ok("get", "sts", "web", "-o", "wide"), "CONTAINERS", "IMAGES", "registry.local/web:1")
	mustContain(t, "hostname and subdomain", k.ok("get", "pod", "web-1", "-o", "jsonpath={.spec.hostname}.{.spec.subdomain}"), "web-1.web")
	mustContain(t, "controller role binding", k.ok("get", "clusterrolebinding", "system:controller:statefulset-controller", "-o",
		"jsonpath={.roleRef.name} {.subjects[0].namespace}/{.subjects[0].name}"),
		"system:controller:statefulset-controller kube-system/statefulset-controller")

	// A deleted pod comes back under its name.
	uid := k.ok("get", "pod", "web-1", "-o", "jsonpath={.metadata.uid}")
	k.ok("delete", "pod", "web-1", "--wait=false")
	proctest.WaitFor(t, "a new web-1 Running", 60*time.Second, func() error {
		out, err := k.run("get", "pod", "web-1", "-o", "jsonpath={.metadata.uid} {.status.phase}")
		if err != nil || strings.HasPrefix(out, uid) || !strings.HasSuffix(out, " Running") {
			return fmt.Errorf("web-1: %s %v", out, err)
		}
		return nil
	})

	images := func() string {
		return k.ok("get", "pods", "-l", "app=web", "-o", `jsonpath={range .items[*]}{.metadata.name}={.spec.containers[0].image} {end}`)
	}
	k.ok("set", "image", "sts/web", "web=registry.local/web:2")
	mustContain(t, "rollout status after set image", k.ok("rollout", "status", "sts/web", "--timeout=60s"), "partitioned roll out complete: 3 new pods have been updated")
	if got := strings.TrimSpace(images()); got != "web-0=registry.local/web:2 web-1=registry.local/web:2 web-2=registry.local/web:2" {
		t.Fatalf("images after set image: %s", got)
	}
	out = k.ok("rollout", "history", "sts/web")
	mustContain(t, "rollout history", out, "REVISION", "1 ", "2 ")
	mustContain(t, "rollout history --revision=2", k.ok("rollout", "history", "sts/web", "--revision=2"), "registry.local/web:2")
	mustContain(t, "controllerrevisions", k.ok("get", "controllerrevisions", "-l", "app=web"), "statefulset.apps/web")

	mustContain(t, "rollout undo", k.ok("rollout", "undo", "sts/web"), "statefulset.apps/web rolled back")
	mustContain(t, "rollout status after undo", k.ok("rollout", "status", "sts/web", "--timeout=60s"), "partitioned roll out complete: 3 new pods have been updated")
	if got := strings.TrimSpace(images()); got != "web-0=registry.local/web:1 web-1=registry.local/web:1 web-2=registry.local/web:1" {
		t.Fatalf("images after rollout undo: %s", got)
	}
	out = k.ok("rollout", "history", "sts/web")
	if !strings.Contains(out, "2 ") || !strings.Contains(out, "3 ") || strings.Contains(out, "\n1 ") {
		t.Fatalf("rollout history after undo, want revisions 2 and 3:\n%s", out)
	}

	// kubectl scale (the /scale subresource): the highest ordinal goes.
	k.ok("scale", "sts/web", "--replicas=2")
	proctest.WaitFor(t, "web scaled to 2", 60*time.Second, func() error {
		if got := k.ok("get", "pods", "-l", "app=web", "-o", "jsonpath={.items[*].metadata.name}"); got != "web-0 web-1" {
			return fmt.Errorf("pods: %s", got)
		}
		return nil
	})
}
