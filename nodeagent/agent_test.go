package nodeagent

import (
	"context"
	"testing"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/skiff-dev/skiff/config"
)

// TestSyncStopsVanishedAndReplacedPods: a pod force-deleted from the API, or replaced by a new pod of the
// same name, is stopped in the runtime (its IP given back) although no deletion was ever seen for it.
func TestSyncStopsVanishedAndReplacedPods(t *testing.T) {
	rt := newSimulatedRuntime()
	rt.setPodCIDR("n1", "10.9.0.0/24")
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", UID: "uid-1"},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "web:1"}}}}
	client := fake.NewSimpleClientset(pod.DeepCopy())
	a := &Agent{cfg: &config.Agent{AdvertiseAddr: "10.0.0.1"}, logger: hclog.NewNullLogger(), runtime: rt, client: client,
		nodes: map[string]bool{"n1": true}, running: map[string]*corev1.Pod{}, statusWrites: make(chan struct{}, 1),
		pods: cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})}
	ctx := context.Background()
	running := func() int { rt.mu.Lock(); defer rt.mu.Unlock(); return len(rt.pods) }

	a.pods.(cache.Indexer).Add(pod)
	if _, err := a.syncPod(ctx, "default/web"); err != nil {
		t.Fatal(err)
	}
	if running() != 1 {
		t.Fatalf("%d pods running after the first sync", running())
	}
	replacement := pod.DeepCopy()
	replacement.UID = "uid-2"
	a.pods.(cache.Indexer).Update(replacement)
	if _, err := a.syncPod(ctx, "default/web"); err != nil {
		t.Fatal(err)
	}
	rt.mu.Lock()
	_, oldRuns := rt.pods["uid-1"]
	_, newRuns := rt.pods["uid-2"]
	rt.mu.Unlock()
	if oldRuns || !newRuns {
		t.Fatalf("after the replacement: old running %v, new running %v", oldRuns, newRuns)
	}
	a.pods.(cache.Indexer).Delete(replacement) // force-deleted: no deletionTimestamp was ever seen
	if _, err := a.syncPod(ctx, "default/web"); err != nil {
		t.Fatal(err)
	}
	if running() != 0 {
		t.Fatalf("%d pods still running after the force delete", running())
	}
	if used := len(rt.ipam["n1"].used); used != 0 {
		t.Fatalf("%d IPs still allocated", used)
	}
}

// countingRuntime counts the pods the runtime brought up from nothing: a pod that runs twice starts twice.
type countingRuntime struct {
	*simulatedRuntime
	starts map[types.UID]int
}

func (r *countingRuntime) SyncPod(ctx context.Context, pod *corev1.Pod) (*PodState, error) {
	r.mu.Lock()
	_, running := r.pods[pod.UID]
	r.mu.Unlock()
	if !running {
		r.starts[pod.UID]++
	}
	return r.simulatedRuntime.SyncPod(ctx, pod)
}

// TestFinishedPodNeverRunsAgain: a restartPolicy Never pod runs to its end, the agent writes Succeeded and
// removes its containers; the next sync (queued by the container's exit, say) still reads the informer's
// older copy, Pending. The agent must not start the pod again: this was issue 30's "run run".
func TestFinishedPodNeverRunsAgain(t *testing.T) {
	rt := &countingRuntime{simulatedRuntime: newSimulatedRuntime(), starts: map[types.UID]int{}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "once", UID: "uid-1",
		Annotations: map[string]string{SimulatedExitCodeAnnotation: "0"}},
		Spec: corev1.PodSpec{NodeName: "n1", RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "c", Image: "busybox:1"}}}}
	client := fake.NewSimpleClientset(pod.DeepCopy())
	a := &Agent{cfg: &config.Agent{AdvertiseAddr: "10.0.0.1"}, logger: hclog.NewNullLogger(), runtime: rt, client: client,
		nodes: map[string]bool{"n1": true}, running: map[string]*corev1.Pod{}, finished: map[string]*corev1.Pod{},
		statusWrites: make(chan struct{}, 1), pods: cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})}
	ctx := context.Background()
	a.pods.(cache.Indexer).Add(pod) // the informer's copy, Pending, for the whole test: the watch lags
	for i := range 3 {
		if _, err := a.syncPod(ctx, "default/once"); err != nil {
			t.Fatalf("sync %d: %v", i, err)
		}
	}
	stored, err := client.CoreV1().Pods("default").Get(ctx, "once", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if stored.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("phase %s after the run; want Succeeded", stored.Status.Phase)
	}
	if n := rt.starts["uid-1"]; n != 1 {
		t.Fatalf("the pod started %d times; want once", n)
	}
	if running := len(rt.pods); running != 0 {
		t.Fatalf("%d pods still running", running)
	}
	// A new pod of the same name (a new UID) runs.
	next := pod.DeepCopy()
	next.UID = "uid-2"
	a.pods.(cache.Indexer).Update(next)
	if _, err := a.syncPod(ctx, "default/once"); err != nil {
		t.Fatal(err)
	}
	if n := rt.starts["uid-2"]; n != 1 {
		t.Fatalf("the replacement started %d times; want once", n)
	}
}
