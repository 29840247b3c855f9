package controller_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/skiff-dev/skiff/internal/servertest"
)

// TestReplicationManager runs a core/v1 ReplicationController through its life on a real server: kube's
// defaults (selector and labels from the template, one replica), its pods made and counted by Kubernetes'
// replication manager, /scale, field paths on bad input, and a v1 delete orphaning its pods.
func TestReplicationManager(t *testing.T) {
	t.Parallel()
	p := servertest.Shared(t)
	c := p.Client
	ns := servertest.Namespace(t, p, "rc")
	ctx := context.Background()
	rcs := c.CoreV1().ReplicationControllers(ns)
	template := &corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "legacy"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "web", Image: "nginx:1.27"}}},
	}
	rc, err := rcs.Create(ctx, &corev1.ReplicationController{
		ObjectMeta: metav1.ObjectMeta{Name: "legacy"},
		Spec:       corev1.ReplicationControllerSpec{Template: template},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rc.Spec.Replicas == nil || *rc.Spec.Replicas != 1 || rc.Spec.Selector["app"] != "legacy" || rc.Labels["app"] != "legacy" || rc.Generation != 1 {
		t.Fatalf("defaults: replicas %v, selector %v, labels %v, generation %d", rc.Spec.Replicas, rc.Spec.Selector, rc.Labels, rc.Generation)
	}
	waitForRC(t, c, rc, 1)

	// /scale, as `kubectl scale rc` uses it: the selector is the label map's.
	scale, err := rcs.GetScale(ctx, "legacy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if scale.Spec.Replicas != 1 || scale.Status.Selector != "app=legacy" {
		t.Fatalf("scale: %+v", scale)
	}
	if _, err := rcs.UpdateScale(ctx, "legacy", &autoscalingv1.Scale{ObjectMeta: metav1.ObjectMeta{Name: "legacy", Namespace: ns},
		Spec: autoscalingv1.ScaleSpec{Replicas: 3}}, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	pods := waitForRC(t, c, rc, 3)
	waitFor(t, "the status to count three replicas", func() (bool, string) {
		got, err := rcs.Get(ctx, "legacy", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return got.Status.Replicas == 3 && got.Status.ObservedGeneration == got.Generation && got.Generation == 2,
			fmt.Sprintf("status %+v, generation %d", got.Status, got.Generation)
	})

	// Bad input is refused with kube's field paths.
	bad := &corev1.ReplicationController{ObjectMeta: metav1.ObjectMeta{Name: "bad"},
		Spec: corev1.ReplicationControllerSpec{Selector: map[string]string{"app": "other"}, Template: template}}
	_, err = rcs.Create(ctx, bad, metav1.CreateOptions{})
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.template.metadata.labels") {
		t.Fatalf("a selector the template's labels do not match: %v", err)
	}
	bad = &corev1.ReplicationController{ObjectMeta: metav1.ObjectMeta{Name: "bad"},
		Spec: corev1.ReplicationControllerSpec{Replicas: ptr(int32(-1)), Template: template}}
	if _, err = rcs.Create(ctx, bad, metav1.CreateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.replicas") {
		t.Fatalf("negative replicas: %v", err)
	}

	// A core/v1 delete orphans the pods, as kube-apiserver's default for this version: they stay, released.
	if err := rcs.Delete(ctx, "legacy", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the pods to be orphaned", func() (bool, string) {
		list, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=legacy"})
		if err != nil {
			return false, err.Error()
		}
		owned := 0
		for _, p := range list.Items {
			if len(p.OwnerReferences) > 0 {
				owned++
			}
		}
		return len(list.Items) == len(pods) && owned == 0, fmt.Sprintf("%d pods, %d still owned", len(list.Items), owned)
	})
}

// waitForRC waits until exactly n live pods are controlled by the ReplicationController, and returns them.
func waitForRC(t *testing.T, c kubernetes.Interface, rc *corev1.ReplicationController, n int) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	waitFor(t, fmt.Sprintf("%d pods controlled by %s", n, rc.Name), func() (bool, string) {
		pods = controlledPods(t, c, rc.Namespace, rc.UID)
		for _, p := range pods {
			if ref := metav1.GetControllerOf(&p); ref.Kind != "ReplicationController" || ref.APIVersion != "v1" || !strings.HasPrefix(p.Name, rc.Name+"-") {
				return false, fmt.Sprintf("pod %s controlled by %+v", p.Name, ref)
			}
		}
		return len(pods) == n, fmt.Sprintf("%d pods: %v", len(pods), podNames(pods))
	})
	return pods
}
