package apiserver_test

import (
	"context"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/skiff-dev/skiff/apiserver"
)

// TestStatusSubresourceKeepsMetadata: a status update or patch changes the status and the metadata it sends
// but never the spec, as kube-apiserver's status strategies do; a Deployment's status endpoint keeps its
// stored labels, and a pod's its owner references.
func TestStatusSubresourceKeepsMetadata(t *testing.T) {
	t.Parallel()
	cfg := apiserver.SharedTestAPI(t)
	ns := apiserver.NamespaceOn(t, cfg, "status")
	client := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()

	svc, err := client.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"}, Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	patched, err := client.CoreV1().Services(ns).Patch(ctx, "web", types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"patched":"yes"},"annotations":{"note":"status"}},"spec":{"selector":{"app":"other"}},"status":{"conditions":[{"type":"Ready","status":"True","reason":"Test","message":"m","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}`),
		metav1.PatchOptions{}, "status")
	if err != nil {
		t.Fatal(err)
	}
	if patched.Labels["patched"] != "yes" || patched.Annotations["note"] != "status" || len(patched.Status.Conditions) != 1 {
		t.Errorf("service after a status patch: labels %v annotations %v conditions %v; want the patch's metadata and status", patched.Labels, patched.Annotations, patched.Status.Conditions)
	}
	if patched.Spec.Selector["app"] != "web" || patched.Generation != svc.Generation {
		t.Errorf("service spec changed through status: selector %v generation %d", patched.Spec.Selector, patched.Generation)
	}

	replicas := int32(1)
	d, err := client.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web", Labels: map[string]string{"app": "web"}},
		Spec: appsv1.DeploymentSpec{Replicas: &replicas, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	d.Labels["app"] = "changed"
	d.Annotations = map[string]string{"note": "status"}
	d.Status.ObservedGeneration = 1
	updated, err := client.AppsV1().Deployments(ns).UpdateStatus(ctx, d, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if updated.Labels["app"] != "web" || updated.Annotations["note"] != "status" || updated.Status.ObservedGeneration != 1 {
		t.Errorf("deployment after a status update: labels %v annotations %v observedGeneration %d; want labels kept, annotation and status taken",
			updated.Labels, updated.Annotations, updated.Status.ObservedGeneration)
	}

	pod, err := client.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"},
		Spec: corev1.PodSpec{SchedulerName: "nobody", Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Labels = map[string]string{"seen": "yes"}
	pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "x", UID: "u"}}
	pod.Status.Message = "hello"
	got, err := client.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Labels["seen"] != "yes" || len(got.OwnerReferences) != 0 || got.Status.Message != "hello" {
		t.Errorf("pod after a status update: labels %v ownerReferences %v message %q; want labels and status taken, owner references kept",
			got.Labels, got.OwnerReferences, got.Status.Message)
	}
}
