package cachetransform

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/skiff-dev/skiff/internal/memshare"
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

// TestSharedWith: an informer's copy equal to the watch cache's comes back as the cache's object; a
// tombstone comes back as it is.
func TestSharedWith(t *testing.T) {
	reg := memshare.NewRegistry()
	// The watch cache's object carries its kind; a typed client's copy does not.
	held := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", ResourceVersion: "7"}, Spec: corev1.PodSpec{NodeName: "n1"}}
	reg.Remember(held, t)
	share := SharedWith(reg)
	copied := held.DeepCopy()
	copied.TypeMeta = metav1.TypeMeta{}
	out, err := share(copied)
	if err != nil || out != held {
		t.Fatalf("an equal copy came back as %p (%v), not the cache's %p", out, err, held)
	}
	tomb := cache.DeletedFinalStateUnknown{Key: "ns/p", Obj: held.DeepCopy()}
	if out, _ := share(tomb); out.(cache.DeletedFinalStateUnknown).Obj == held {
		t.Error("a tombstone's object was replaced")
	}
}
