package controller_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/skiff-dev/skiff/internal/servertest"
)

// keepPodsReady does what a node agent would, for as long as the test runs: every pod in the namespace that
// is not being deleted is made Running and Ready.
func keepPodsReady(t *testing.T, c kubernetes.Interface, ns string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			list, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			if err == nil {
				for i := range list.Items {
					pod := &list.Items[i]
					if pod.DeletionTimestamp != nil || podReady(pod) {
						continue
					}
					pod.Status.Phase = corev1.PodRunning
					pod.Status.Conditions = append(slices.DeleteFunc(pod.Status.Conditions, func(c corev1.PodCondition) bool { return c.Type == corev1.PodReady }),
						corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()})
					_, _ = c.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}) // a conflict is retried next round
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podHistory follows the pods of one app through a watch that starts where a listing ends, so it sees every
// state the store went through, in order, and checks the rollout invariants at each.
type podHistory struct {
	mu       sync.Mutex
	pods     map[string]*corev1.Pod
	maxLive  int      // most pods not being deleted at once
	minReady int      // fewest ready pods not being deleted at once; -1 before the first count
	early    []string // pods oldHash does not mark that were created while one it marks existed
	oldHash  string   // the pod-template-hash of the old pods, for Recreate; "" to not check
	seen     map[string]bool
}

func watchPods(t *testing.T, c kubernetes.Interface, ns, app, oldHash string) *podHistory {
	t.Helper()
	ctx := context.Background()
	list, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: "app=" + app, ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	h := &podHistory{pods: map[string]*corev1.Pod{}, minReady: -1, oldHash: oldHash, seen: map[string]bool{}}
	for i := range list.Items {
		h.pods[list.Items[i].Name] = &list.Items[i]
	}
	h.record()
	go func() {
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			h.mu.Lock()
			switch ev.Type {
			case watch.Added, watch.Modified:
				if ev.Type == watch.Added && h.oldHash != "" && pod.Labels[appsv1.DefaultDeploymentUniqueLabelKey] != h.oldHash {
					for name, p := range h.pods {
						if p.Labels[appsv1.DefaultDeploymentUniqueLabelKey] == h.oldHash {
							h.early = append(h.early, fmt.Sprintf("%s created while %s existed", pod.Name, name))
						}
					}
				}
				h.pods[pod.Name] = pod
				h.seen[pod.Name] = true
			case watch.Deleted:
				delete(h.pods, pod.Name)
			}
			h.mu.Unlock()
			h.record()
		}
	}()
	return h
}

func (h *podHistory) record() {
	h.mu.Lock()
	defer h.mu.Unlock()
	live, ready := 0, 0
	for _, p := range h.pods {
		if p.DeletionTimestamp != nil {
			continue
		}
		live++
		if podReady(p) {
			ready++
		}
	}
	h.maxLive = max(h.maxLive, live)
	if h.minReady < 0 || ready < h.minReady {
		h.minReady = ready
	}
}

func (h *podHistory) snapshot() (maxLive, minReady int, early []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.maxLive, h.minReady, slices.Clone(h.early)
}

// sawPods reports whether the watch saw at least n pods, so that a check that found nothing wrong is known
// to have looked.
func (h *podHistory) sawPods(t *testing.T, n int) {
	t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.seen) < n {
		t.Errorf("the watch saw %d pods, want at least %d", len(h.seen), n)
	}
}

func webDeployment(ns, name, image string, replicas int32) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: map[string]string{
			"team": "web", corev1.LastAppliedConfigAnnotation: "{}"}},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: image}}},
			},
		},
	}
}

func updateDeployment(t *testing.T, c kubernetes.Interface, ns, name string, change func(*appsv1.Deployment)) *appsv1.Deployment {
	t.Helper()
	var out *appsv1.Deployment
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		d, err := c.AppsV1().Deployments(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(d)
		out, err = c.AppsV1().Deployments(ns).Update(context.Background(), d, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// ownedReplicaSets lists the Deployment's ReplicaSets, by name.
func ownedReplicaSets(t *testing.T, c kubernetes.Interface, ns string, d *appsv1.Deployment) map[string]*appsv1.ReplicaSet {
	t.Helper()
	list, err := c.AppsV1().ReplicaSets(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*appsv1.ReplicaSet{}
	for i := range list.Items {
		if ref := metav1.GetControllerOf(&list.Items[i]); ref != nil && ref.UID == d.UID {
			out[list.Items[i].Name] = &list.Items[i]
		}
	}
	return out
}

// waitRolloutDone waits for what kubectl rollout status waits for, plus the conditions Kubernetes sets on a
// complete rollout, a ReplicaSet running image with all the replicas, and the others at zero. It returns the
// Deployment and that ReplicaSet.
func waitRolloutDone(t *testing.T, c kubernetes.Interface, ns, name, image string) (*appsv1.Deployment, *appsv1.ReplicaSet) {
	t.Helper()
	var d *appsv1.Deployment
	var newRS *appsv1.ReplicaSet
	waitFor(t, fmt.Sprintf("deployment %s to roll out %s", name, image), func() (bool, string) {
		var err error
		d, err = c.AppsV1().Deployments(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		s, want := d.Status, *d.Spec.Replicas
		if s.ObservedGeneration < d.Generation || s.UpdatedReplicas != want || s.Replicas != want || s.AvailableReplicas != want || s.ReadyReplicas != want {
			return false, fmt.Sprintf("generation %d, status %+v", d.Generation, s)
		}
		avail, prog := condition(d, appsv1.DeploymentAvailable), condition(d, appsv1.DeploymentProgressing)
		if avail == nil || avail.Status != corev1.ConditionTrue || avail.Reason != "MinimumReplicasAvailable" ||
			prog == nil || prog.Status != corev1.ConditionTrue || prog.Reason != "NewReplicaSetAvailable" {
			return false, fmt.Sprintf("conditions %+v", s.Conditions)
		}
		newRS = nil
		for _, rs := range ownedReplicaSets(t, c, ns, d) {
			if rs.Spec.Template.Spec.Containers[0].Image == image {
				newRS = rs
			} else if *rs.Spec.Replicas != 0 || rs.Status.Replicas != 0 {
				return false, fmt.Sprintf("old replica set %s has %d/%d replicas", rs.Name, rs.Status.Replicas, *rs.Spec.Replicas)
			}
		}
		if newRS == nil || *newRS.Spec.Replicas != want || newRS.Status.AvailableReplicas != want {
			return false, fmt.Sprintf("new replica set %+v", newRS)
		}
		if d.Annotations["deployment.kubernetes.io/revision"] != newRS.Annotations["deployment.kubernetes.io/revision"] {
			return false, fmt.Sprintf("deployment revision %q, replica set's %q", d.Annotations["deployment.kubernetes.io/revision"],
				newRS.Annotations["deployment.kubernetes.io/revision"])
		}
		return true, ""
	})
	return d, newRS
}

func condition(d *appsv1.Deployment, t appsv1.DeploymentConditionType) *appsv1.DeploymentCondition {
	for i := range d.Status.Conditions {
		if d.Status.Conditions[i].Type == t {
			return &d.Status.Conditions[i]
		}
	}
	return nil
}

func setImage(image string) func(*appsv1.Deployment) {
	return func(d *appsv1.Deployment) { d.Spec.Template.Spec.Containers[0].Image = image }
}

// startDeploymentServer gives the test a namespace of its own on the shared server, whose pods are made
// Ready as a node agent would.
func startDeploymentServer(t *testing.T) (kubernetes.Interface, string) {
	t.Parallel()
	p := servertest.Shared(t)
	ns := servertest.Namespace(t, p, "deploy")
	keepPodsReady(t, p.Client, ns)
	return p.Client, ns
}

// TestDeploymentRollingUpdate takes a Deployment through what kubectl users do: create, change the image,
// roll back, scale, trim the history, pause and resume.
func TestDeploymentRollingUpdate(t *testing.T) {
	c, ns := startDeploymentServer(t)
	ctx := context.Background()
	d, err := c.AppsV1().Deployments(ns).Create(ctx, webDeployment(ns, "web", "nginx:1.27", 3), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// One ReplicaSet, named after the template's hash, at revision 1, with the Deployment's annotations
	// but not kubectl's last-applied one.
	_, first := waitRolloutDone(t, c, ns, "web", "nginx:1.27")
	hash := first.Labels[appsv1.DefaultDeploymentUniqueLabelKey]
	if hash == "" || first.Name != "web-"+hash || first.Spec.Selector.MatchLabels[appsv1.DefaultDeploymentUniqueLabelKey] != hash ||
		first.Spec.Template.Labels[appsv1.DefaultDeploymentUniqueLabelKey] != hash {
		t.Errorf("replica set %s: labels %v, selector %v, template labels %v", first.Name, first.Labels, first.Spec.Selector, first.Spec.Template.Labels)
	}
	if a := first.Annotations; a["deployment.kubernetes.io/revision"] != "1" || a["deployment.kubernetes.io/desired-replicas"] != "3" ||
		a["deployment.kubernetes.io/max-replicas"] != "4" || a["team"] != "web" || a[corev1.LastAppliedConfigAnnotation] != "" {
		t.Errorf("first replica set's annotations: %v", a)
	}
	if rss := ownedReplicaSets(t, c, ns, d); len(rss) != 1 {
		t.Fatalf("%d replica sets, want 1", len(rss))
	}
	waitFor(t, "a ScalingReplicaSet event", func() (bool, string) {
		list, err := c.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=web,reason=ScalingReplicaSet"})
		if err != nil {
			return false, err.Error()
		}
		for _, ev := range list.Items {
			if ev.Source.Component == "deployment-controller" && ev.InvolvedObject.Kind == "Deployment" && ev.Message == "Scaled up replica set "+first.Name+" from 0 to 3" {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d events", len(list.Items))
	})

	// A new image: a second ReplicaSet at revision 2. With 25% of 3, one pod may surge and none may be
	// unavailable; the old ReplicaSet ends at zero and is kept.
	history := watchPods(t, c, ns, "web", "")
	updateDeployment(t, c, ns, "web", setImage("nginx:1.28"))
	_, second := waitRolloutDone(t, c, ns, "web", "nginx:1.28")
	if second.Name == first.Name || second.Annotations["deployment.kubernetes.io/revision"] != "2" {
		t.Errorf("second replica set %s at revision %q", second.Name, second.Annotations["deployment.kubernetes.io/revision"])
	}
	if maxLive, minReady, _ := history.snapshot(); maxLive > 4 || minReady < 3 {
		t.Errorf("during the rollout: up to %d pods (at most 4 allowed), as few as %d ready (at least 3 required)", maxLive, minReady)
	}
	history.sawPods(t, 6)
	if rss := ownedReplicaSets(t, c, ns, d); len(rss) != 2 || rss[first.Name] == nil {
		t.Errorf("replica sets after the rollout: %v", keys(rss))
	}

	// kubectl rollout undo puts the first template back: the first ReplicaSet is the new one again, at
	// revision 3, remembering it was revision 1.
	history = watchPods(t, c, ns, "web", "")
	updateDeployment(t, c, ns, "web", setImage("nginx:1.27"))
	d, back := waitRolloutDone(t, c, ns, "web", "nginx:1.27")
	if maxLive, minReady, _ := history.snapshot(); maxLive > 4 || minReady < 3 {
		t.Errorf("during the rollback: up to %d pods (at most 4 allowed), as few as %d ready (at least 3 required)", maxLive, minReady)
	}
	if back.Name != first.Name || back.Annotations["deployment.kubernetes.io/revision"] != "3" ||
		back.Annotations["deployment.kubernetes.io/revision-history"] != "1" || d.Annotations["deployment.kubernetes.io/revision"] != "3" {
		t.Errorf("after rollback: replica set %s, annotations %v; deployment's %v", back.Name, back.Annotations, d.Annotations)
	}

	// Scaling.
	updateDeployment(t, c, ns, "web", func(d *appsv1.Deployment) { d.Spec.Replicas = ptr(int32(5)) })
	_, scaled := waitRolloutDone(t, c, ns, "web", "nginx:1.27")
	if scaled.Name != first.Name || scaled.Annotations["deployment.kubernetes.io/desired-replicas"] != "5" ||
		scaled.Annotations["deployment.kubernetes.io/max-replicas"] != "7" {
		t.Errorf("after scaling: replica set %s, annotations %v", scaled.Name, scaled.Annotations)
	}

	// With a history of one, the oldest zero-sized ReplicaSet (the second, revision 2) goes.
	updateDeployment(t, c, ns, "web", func(d *appsv1.Deployment) {
		d.Spec.RevisionHistoryLimit = ptr(int32(1))
		d.Spec.Template.Spec.Containers[0].Image = "nginx:1.29"
	})
	_, fourth := waitRolloutDone(t, c, ns, "web", "nginx:1.29")
	waitFor(t, "the history to be trimmed to one", func() (bool, string) {
		rss := ownedReplicaSets(t, c, ns, d)
		return len(rss) == 2 && rss[first.Name] != nil && rss[fourth.Name] != nil, fmt.Sprint(keys(rss))
	})
	if fourth.Annotations["deployment.kubernetes.io/revision"] != "4" {
		t.Errorf("fourth replica set at revision %q", fourth.Annotations["deployment.kubernetes.io/revision"])
	}

	// Paused: a new template makes no ReplicaSet, and Progressing says why; resumed, the rollout goes on.
	updateDeployment(t, c, ns, "web", func(d *appsv1.Deployment) { d.Spec.Paused = true })
	paused := updateDeployment(t, c, ns, "web", setImage("nginx:1.30"))
	waitFor(t, "the pause to be recorded", func() (bool, string) {
		got, err := c.AppsV1().Deployments(ns).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		p := condition(got, appsv1.DeploymentProgressing)
		return got.Status.ObservedGeneration >= paused.Generation && p != nil && p.Reason == "DeploymentPaused" && p.Status == corev1.ConditionUnknown,
			fmt.Sprintf("observed %d of %d, conditions %+v", got.Status.ObservedGeneration, paused.Generation, got.Status.Conditions)
	})
	// (Paused, the Deployment trims its history counting the running ReplicaSet as old, since the template
	// is no longer its: with a limit of one, the first goes. That is Kubernetes' behaviour too.)
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		for _, rs := range ownedReplicaSets(t, c, ns, d) {
			if rs.Spec.Template.Spec.Containers[0].Image == "nginx:1.30" {
				t.Fatalf("paused, yet replica set %s was created for the new template", rs.Name)
			}
		}
	}
	updateDeployment(t, c, ns, "web", func(d *appsv1.Deployment) { d.Spec.Paused = false })
	_, fifth := waitRolloutDone(t, c, ns, "web", "nginx:1.30")
	if fifth.Annotations["deployment.kubernetes.io/revision"] != "5" {
		t.Errorf("fifth replica set at revision %q", fifth.Annotations["deployment.kubernetes.io/revision"])
	}
}

// TestDeploymentRecreate: the old pods are all gone before the first new one is created.
func TestDeploymentRecreate(t *testing.T) {
	c, ns := startDeploymentServer(t)
	ctx := context.Background()
	batch := webDeployment(ns, "batch", "busybox:1.36", 3)
	batch.Spec.Strategy = appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}
	if _, err := c.AppsV1().Deployments(ns).Create(ctx, batch, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, first := waitRolloutDone(t, c, ns, "batch", "busybox:1.36")

	history := watchPods(t, c, ns, "batch", first.Labels[appsv1.DefaultDeploymentUniqueLabelKey])
	updateDeployment(t, c, ns, "batch", setImage("busybox:1.37"))
	_, second := waitRolloutDone(t, c, ns, "batch", "busybox:1.37")
	if second.Annotations["deployment.kubernetes.io/revision"] != "2" {
		t.Errorf("second replica set at revision %q", second.Annotations["deployment.kubernetes.io/revision"])
	}
	if _, _, early := history.snapshot(); len(early) > 0 {
		t.Errorf("Recreate overlapped old and new pods: %v", early)
	}
	history.sawPods(t, 6)
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
