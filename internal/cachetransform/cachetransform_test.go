package cachetransform

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

func TestStripManagedFields(t *testing.T) {
	pod := func() *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Labels: map[string]string{"a": "b"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply}}}}
	}
	out, err := StripManagedFields(pod())
	if err != nil {
		t.Fatal(err)
	}
	if p := out.(*corev1.Pod); p.ManagedFields != nil || p.Labels["a"] != "b" {
		t.Errorf("stripped pod: %+v", p.ObjectMeta)
	}
	tomb := cache.DeletedFinalStateUnknown{Key: "ns/p", Obj: pod()}
	out, err = StripManagedFields(tomb)
	if err != nil {
		t.Fatal(err)
	}
	got, ok := out.(cache.DeletedFinalStateUnknown)
	if !ok {
		t.Fatalf("a tombstone came back as %T", out)
	}
	if got.Obj.(*corev1.Pod).ManagedFields != nil {
		t.Error("the tombstone's object kept its managed fields")
	}
	if out, err := StripManagedFields("not an object"); err != nil || out != "not an object" {
		t.Errorf("a non-object: %v, %v", out, err)
	}
}

func TestForAPIServerKeepsSpecAndClaims(t *testing.T) {
	claim := "pod-gpu-x7k2"
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}},
		Spec:       corev1.PodSpec{NodeName: "n1", ServiceAccountName: "sa"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1",
			ResourceClaimStatuses: []corev1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: &claim}}},
	}
	out, err := ForAPIServer(cache.DeletedFinalStateUnknown{Key: "ns/p", Obj: pod})
	if err != nil {
		t.Fatal(err)
	}
	got := out.(cache.DeletedFinalStateUnknown).Obj.(*corev1.Pod)
	if got.ManagedFields != nil || got.Status.Phase != "" || got.Status.PodIP != "" {
		t.Errorf("managed fields or status kept: %+v %+v", got.ManagedFields, got.Status)
	}
	if got.Spec.NodeName != "n1" || got.Spec.ServiceAccountName != "sa" || len(got.Status.ResourceClaimStatuses) != 1 ||
		*got.Status.ResourceClaimStatuses[0].ResourceClaimName != claim {
		t.Errorf("spec or claim statuses lost: %+v %+v", got.Spec, got.Status)
	}
	node := &corev1.Node{Status: corev1.NodeStatus{Phase: corev1.NodeRunning}}
	if out, _ := ForAPIServer(node); out.(*corev1.Node).Status.Phase != corev1.NodeRunning {
		t.Error("a node's status was dropped")
	}
}
