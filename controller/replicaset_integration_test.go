package controller_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/skiff-dev/skiff/internal/servertest"
)

// waitFor polls cond until it reports true, failing the test with cond's last explanation at the deadline.
func waitFor(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s: %s", what, why)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// controlledPods lists the pods whose controller is the ReplicaSet with this UID and that are not being
// deleted.
func controlledPods(t *testing.T, c kubernetes.Interface, ns string, uid types.UID) []corev1.Pod {
	t.Helper()
	list, err := c.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []corev1.Pod
	for _, p := range list.Items {
		if ref := metav1.GetControllerOf(&p); ref != nil && ref.UID == uid && p.DeletionTimestamp == nil {
			out = append(out, p)
		}
	}
	return out
}

func podNames(pods []corev1.Pod) []string {
	var names []string
	for _, p := range pods {
		names = append(names, p.Name)
	}
	slices.Sort(names)
	return names
}

// waitForControlled waits until exactly n live pods are controlled by the ReplicaSet, and returns them.
func waitForControlled(t *testing.T, c kubernetes.Interface, ns string, rs *appsv1.ReplicaSet, n int) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	waitFor(t, fmt.Sprintf("%d pods controlled by %s", n, rs.Name), func() (bool, string) {
		pods = controlledPods(t, c, ns, rs.UID)
		return len(pods) == n, fmt.Sprintf("%d pods: %v", len(pods), podNames(pods))
	})
	return pods
}

func updateReplicaSet(t *testing.T, c kubernetes.Interface, ns, name string, change func(*appsv1.ReplicaSet)) *appsv1.ReplicaSet {
	t.Helper()
	var out *appsv1.ReplicaSet
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		rs, err := c.AppsV1().ReplicaSets(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		change(rs)
		out, err = c.AppsV1().ReplicaSets(ns).Update(context.Background(), rs, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// markReady does what a node agent would: the pod runs and is Ready since readySince.
func markReady(t *testing.T, c kubernetes.Interface, ns, name string, readySince time.Time) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pod, err := c.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		pod.Status.Phase = corev1.PodRunning
		ready := corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(readySince)}
		pod.Status.Conditions = slices.DeleteFunc(pod.Status.Conditions, func(c corev1.PodCondition) bool { return c.Type == corev1.PodReady })
		pod.Status.Conditions = append(pod.Status.Conditions, ready)
		_, err = c.CoreV1().Pods(ns).UpdateStatus(context.Background(), pod, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

func webReplicaSet(ns, name string, replicas int32) *appsv1.ReplicaSet {
	return &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.ReplicaSetSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name, "tier": "front"}},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "nginx:1.27"}}},
			},
		},
	}
}

// waitForEvent waits for an event on the ReplicaSet with this reason, from the replicaset controller.
func waitForEvent(t *testing.T, c kubernetes.Interface, ns, rsName, reason, messagePrefix string) {
	t.Helper()
	waitFor(t, fmt.Sprintf("a %s event on %s", reason, rsName), func() (bool, string) {
		list, err := c.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{
			FieldSelector: "involvedObject.name=" + rsName + ",reason=" + reason})
		if err != nil {
			return false, err.Error()
		}
		for _, ev := range list.Items {
			if ev.Source.Component == "replicaset-controller" && ev.InvolvedObject.Kind == "ReplicaSet" && strings.HasPrefix(ev.Message, messagePrefix) {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d %s events, none from replicaset-controller starting %q", len(list.Items), reason, messagePrefix)
	})
}

// creations records every pod the watch reports added, so that a pod created twice shows even after the
// controller has deleted the surplus.
type creations struct {
	mu    sync.Mutex
	names map[string]bool
}

func watchCreations(t *testing.T, c kubernetes.Interface, ns, selector string) *creations {
	t.Helper()
	w, err := c.CoreV1().Pods(ns).Watch(context.Background(), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	cr := &creations{names: map[string]bool{}}
	go func() {
		for ev := range w.ResultChan() {
			if pod, ok := ev.Object.(*corev1.Pod); ok && ev.Type == watch.Added {
				cr.mu.Lock()
				cr.names[pod.Name] = true
				cr.mu.Unlock()
			}
		}
	}()
	return cr
}

func (cr *creations) count() int {
	cr.mu.Lock()
	defer cr.mu.Unlock()
	return len(cr.names)
}

// holdAt checks for a while that the ReplicaSet keeps exactly n pods, and that no more than created pods
// were ever made.
func holdAt(t *testing.T, c kubernetes.Interface, ns string, rs *appsv1.ReplicaSet, n int, cr *creations, created int) {
	t.Helper()
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if pods := controlledPods(t, c, ns, rs.UID); len(pods) != n {
			t.Fatalf("%d pods for %d replicas: %v", len(pods), n, podNames(pods))
		}
	}
	if got := cr.count(); got != created {
		t.Fatalf("%d pods created in all, want %d", got, created)
	}
}

// TestReplicaSetController runs the controller on a real server, through one ReplicaSet's life: creation
// without duplicates, scaling, replacement, adoption, release, readiness and availability, and garbage
// collection of its pods when it is deleted.
func TestReplicaSetController(t *testing.T) {
	t.Parallel()
	p := servertest.Shared(t)
	c := p.Client
	ns := servertest.Namespace(t, p, "rs")
	ctx := context.Background()
	created := watchCreations(t, c, ns, "app=web")
	rs, err := c.AppsV1().ReplicaSets(ns).Create(ctx, webReplicaSet(ns, "web", 3), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	// Three pods, named after the ReplicaSet and controlled by it; and three they stay: a controller acting
	// on a cache that lags its own creates would make more.
	pods := waitForControlled(t, c, ns, rs, 3)
	for _, p := range pods {
		ref := metav1.GetControllerOf(&p)
		if p.GenerateName != "web-" || !strings.HasPrefix(p.Name, "web-") || ref.Kind != "ReplicaSet" || ref.APIVersion != "apps/v1" ||
			ref.Name != "web" || ref.BlockOwnerDeletion == nil || !*ref.BlockOwnerDeletion || p.Labels["tier"] != "front" {
			t.Errorf("pod %s: generateName %q, labels %v, controller %+v", p.Name, p.GenerateName, p.Labels, ref)
		}
	}
	holdAt(t, c, ns, rs, 3, created, 3)
	waitForEvent(t, c, ns, "web", "SuccessfulCreate", "Created pod: web-")

	// Scaling.
	updateReplicaSet(t, c, ns, "web", func(rs *appsv1.ReplicaSet) { rs.Spec.Replicas = ptr(int32(5)) })
	waitForControlled(t, c, ns, rs, 5)
	holdAt(t, c, ns, rs, 5, created, 5)
	updateReplicaSet(t, c, ns, "web", func(rs *appsv1.ReplicaSet) { rs.Spec.Replicas = ptr(int32(1)) })
	waitForControlled(t, c, ns, rs, 1)
	waitForEvent(t, c, ns, "web", "SuccessfulDelete", "Deleted pod: web-")
	updateReplicaSet(t, c, ns, "web", func(rs *appsv1.ReplicaSet) { rs.Spec.Replicas = ptr(int32(3)) })
	pods = waitForControlled(t, c, ns, rs, 3)

	// A deleted pod is replaced.
	victim := pods[0].Name
	if err := c.CoreV1().Pods(ns).Delete(ctx, victim, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deleted pod to be replaced", func() (bool, string) {
		names := podNames(controlledPods(t, c, ns, rs.UID))
		return len(names) == 3 && !slices.Contains(names, victim), fmt.Sprint(names)
	})

	// An orphan the selector matches is adopted, and the surplus goes. The orphan runs and is ready, so the
	// ranking keeps it and deletes one of the pending pods; it lacks the template's "tier" label, so it is
	// not fully labelled. It is made to match only once ready, so that it cannot be taken before.
	orphan := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "orphan", Namespace: ns, Labels: map[string]string{"app": "not-yet"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "nginx:1.27"}}},
	}
	if _, err := c.CoreV1().Pods(ns).Create(ctx, orphan, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	markReady(t, c, ns, "orphan", time.Now().Add(-2*time.Hour))
	if _, err := c.CoreV1().Pods(ns).Patch(ctx, "orphan", types.MergePatchType, []byte(`{"metadata":{"labels":{"app":"web"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the orphan to be adopted and the surplus deleted", func() (bool, string) {
		names := podNames(controlledPods(t, c, ns, rs.UID))
		return len(names) == 3 && slices.Contains(names, "orphan"), fmt.Sprint(names)
	})
	adopted, err := c.CoreV1().Pods(ns).Get(ctx, "orphan", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ref := metav1.GetControllerOf(adopted); ref == nil || ref.UID != rs.UID || ref.Kind != "ReplicaSet" || ref.BlockOwnerDeletion == nil || !*ref.BlockOwnerDeletion {
		t.Errorf("adopted pod's controller reference: %+v", ref)
	}

	// A pod whose labels stop matching is released (and kept), and replaced.
	var released string
	for _, p := range controlledPods(t, c, ns, rs.UID) {
		if p.Name != "orphan" {
			released = p.Name
			break
		}
	}
	if _, err := c.CoreV1().Pods(ns).Patch(ctx, released, types.MergePatchType, []byte(`{"metadata":{"labels":{"app":"elsewhere"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the relabelled pod to be released and replaced", func() (bool, string) {
		pod, err := c.CoreV1().Pods(ns).Get(ctx, released, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		names := podNames(controlledPods(t, c, ns, rs.UID))
		return len(pod.OwnerReferences) == 0 && len(names) == 3 && !slices.Contains(names, released),
			fmt.Sprintf("released pod's owners %v; controlled %v", pod.OwnerReferences, names)
	})
	if err := c.CoreV1().Pods(ns).Delete(ctx, released, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}

	// Readiness and availability. With minReadySeconds an hour, only the orphan (ready two hours ago) is
	// available. Then the others are marked ready afresh and minReadySeconds lowered to two seconds: they
	// become available two seconds later, with no event to prompt that sync.
	rs = updateReplicaSet(t, c, ns, "web", func(rs *appsv1.ReplicaSet) { rs.Spec.MinReadySeconds = 3600 })
	for _, p := range controlledPods(t, c, ns, rs.UID) {
		if p.Name != "orphan" {
			markReady(t, c, ns, p.Name, time.Now())
		}
	}
	waitFor(t, "the status to count ready and available pods", func() (bool, string) {
		got, err := c.AppsV1().ReplicaSets(ns).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		s := got.Status
		return s.Replicas == 3 && s.FullyLabeledReplicas == 2 && s.ReadyReplicas == 3 && s.AvailableReplicas == 1 &&
				s.ObservedGeneration == got.Generation && len(s.Conditions) == 0,
			fmt.Sprintf("generation %d, status %+v", got.Generation, s)
	})
	if rs.Generation == 0 {
		t.Logf("the API server does not set metadata.generation on ReplicaSets: observedGeneration proves little")
	}
	for _, p := range controlledPods(t, c, ns, rs.UID) {
		if p.Name != "orphan" {
			markReady(t, c, ns, p.Name, time.Now())
		}
	}
	rs = updateReplicaSet(t, c, ns, "web", func(rs *appsv1.ReplicaSet) { rs.Spec.MinReadySeconds = 2 })
	waitFor(t, "every ready pod to become available", func() (bool, string) {
		got, err := c.AppsV1().ReplicaSets(ns).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		s := got.Status
		return s.ReadyReplicas == 3 && s.AvailableReplicas == 3 && s.ObservedGeneration == got.Generation, fmt.Sprintf("status %+v", s)
	})

	// Deleted in the background, the ReplicaSet goes at once and the garbage collector takes its pods.
	background := metav1.DeletePropagationBackground
	if err := c.AppsV1().ReplicaSets(ns).Delete(ctx, "web", metav1.DeleteOptions{PropagationPolicy: &background}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the ReplicaSet's pods to be collected", func() (bool, string) {
		list, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		var left []string
		for _, p := range list.Items {
			for _, ref := range p.OwnerReferences {
				if ref.UID == rs.UID {
					left = append(left, p.Name)
				}
			}
		}
		return len(left) == 0, fmt.Sprintf("pods left: %v", left)
	})
	if _, err := c.AppsV1().ReplicaSets(ns).Get(ctx, "web", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the ReplicaSet is still there: %v", err)
	}
}

// TestReplicaSetCreateFailure: when the API refuses the template's pods, the ReplicaSet says so (an event
// and the ReplicaFailure condition), and recovers once the template is fixed.
func TestReplicaSetCreateFailure(t *testing.T) {
	t.Parallel()
	p := servertest.Shared(t)
	c := p.Client
	ns := servertest.Namespace(t, p, "rs")
	ctx := context.Background()
	broken := webReplicaSet(ns, "broken", 2)
	// A valid ReplicaSet whose pods priority admission refuses: the PriorityClass does not exist.
	broken.Spec.Template.Spec.PriorityClassName = "no-such-class"
	rs, err := c.AppsV1().ReplicaSets(ns).Create(ctx, broken, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the ReplicaFailure condition", func() (bool, string) {
		got, err := c.AppsV1().ReplicaSets(ns).Get(ctx, "broken", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, cond := range got.Status.Conditions {
			if cond.Type == appsv1.ReplicaSetReplicaFailure && cond.Status == corev1.ConditionTrue && cond.Reason == "FailedCreate" && cond.Message != "" {
				return true, ""
			}
		}
		return false, fmt.Sprintf("conditions %+v", got.Status.Conditions)
	})
	waitForEvent(t, c, ns, "broken", "FailedCreate", "Error creating: ")

	updateReplicaSet(t, c, ns, "broken", func(rs *appsv1.ReplicaSet) {
		rs.Spec.Template.Spec.PriorityClassName = ""
	})
	waitForControlled(t, c, ns, rs, 2)
	waitFor(t, "the ReplicaFailure condition to clear", func() (bool, string) {
		got, err := c.AppsV1().ReplicaSets(ns).Get(ctx, "broken", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return len(got.Status.Conditions) == 0 && got.Status.Replicas == 2, fmt.Sprintf("status %+v", got.Status)
	})
}

func ptr[T any](v T) *T { return &v }
