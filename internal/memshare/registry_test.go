package memshare

import (
	"sync"
	"testing"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// fresh is pod i as decoding makes it: every string and slice its own, none a literal of this file. It
// carries its kind, as the watch cache's objects do.
func fresh(t testing.TB, i int) *corev1.Pod { return decode(t, versions(t, i)[0]) }

// typed is pod i as a typed client decodes it, for an informer: without apiVersion and kind.
func typed(t testing.TB, i int) *corev1.Pod {
	p := fresh(t, i)
	p.TypeMeta = metav1.TypeMeta{}
	return p
}

// TestRegistryShare: an informer's copy of a held object comes back as the held object when equal
// throughout, and otherwise keeps its own values while pointing its equal parts at the held one's.
func TestRegistryShare(t *testing.T) {
	r := NewRegistry()
	watch := new(int)
	held := fresh(t, 1)
	r.Remember(held, watch)

	if got := r.Share(typed(t, 1)); got != held {
		t.Fatalf("an equal copy came back as %p, not the held %p", got, held)
	}
	newer := typed(t, 1)
	newer.Spec.NodeName = "node-9"
	if got := r.Share(newer); got != newer {
		t.Fatal("a copy that differs came back as another object")
	}
	if newer.Spec.NodeName != "node-9" {
		t.Fatalf("the copy's own value changed: %q", newer.Spec.NodeName)
	}
	if unsafe.StringData(newer.Spec.Containers[0].Image) != unsafe.StringData(held.Spec.Containers[0].Image) {
		t.Error("the copy does not share its equal parts with the held object")
	}
	other := typed(t, 2)
	if got := r.Share(other); got != other || unsafe.StringData(other.Name) == unsafe.StringData(held.Name) {
		t.Error("an object of another name was shared")
	}
	if r.Share(nil) != nil || r.Share("not an object") != "not an object" {
		t.Error("what has no object metadata did not come back as it was")
	}
	var none *Registry
	if p := fresh(t, 1); none.Share(p) != p {
		t.Error("a nil registry changed an object")
	}
}

// TestRegistryRememberForgetRelease: a new version shares memory with the one held before it and takes its
// place; a deleted object goes; an ended watch's objects go, but for those another watch remembered since.
func TestRegistryRememberForgetRelease(t *testing.T) {
	r := NewRegistry()
	first, second := new(int), new(int)
	v1 := fresh(t, 1)
	r.Remember(v1, first)
	v2 := fresh(t, 1)
	v2.Spec.NodeName = "node-1"
	r.Remember(v2, first)
	if unsafe.StringData(v2.Spec.Containers[0].Image) != unsafe.StringData(v1.Spec.Containers[0].Image) {
		t.Error("a new version does not share its unchanged parts with the one before")
	}
	if got := r.Share(typed(t, 1)); got == v2 || got == v1 {
		t.Error("an old version's copy came back as a held object")
	}
	r.Remember(fresh(t, 2), first)
	r.Remember(fresh(t, 3), first)
	held3 := fresh(t, 3)
	r.Remember(held3, second)
	r.Forget(fresh(t, 2))
	if r.Len() != 2 {
		t.Fatalf("after a deletion the registry holds %d, want 2", r.Len())
	}
	r.Release(first)
	if r.Len() != 1 {
		t.Fatalf("after the first watch ended the registry holds %d, want 1 (the second watch's)", r.Len())
	}
	if r.Share(typed(t, 3)) != held3 {
		t.Fatal("the second watch's object is gone")
	}
}

// TestRegistryConcurrent is for the race detector: a watch remembers while informers share.
func TestRegistryConcurrent(t *testing.T) {
	r := NewRegistry()
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range 200 {
			r.Remember(fresh(t, i%10), r)
		}
	})
	for range 2 {
		wg.Go(func() {
			for i := range 200 {
				r.Share(typed(t, i%10))
			}
		})
	}
	wg.Wait()
}

// TestRegistryShareAdoptsTheCachesKind: the watch cache's object carries its kind and a typed client's copy
// does not; the copy is the cache's object all the same. A copy that differs takes its type's kind too (the
// mark of what Share has shared), and a kind that is not the copy's type's is not taken.
func TestRegistryShareAdoptsTheCachesKind(t *testing.T) {
	r := NewRegistry()
	held := fresh(t, 1)
	r.Remember(held, r)
	if got := r.Share(typed(t, 1)); got != held {
		t.Fatal("a typed client's copy without its kind did not come back as the cache's object")
	}
	differs := typed(t, 1)
	differs.Spec.NodeName = "node-9"
	if got := r.Share(differs); got != differs || differs.Kind != "Pod" || differs.APIVersion != "v1" {
		t.Fatalf("a copy that differs came back as %p with kind %q %q", got, differs.APIVersion, differs.Kind)
	}

	wrong := fresh(t, 2)
	wrong.APIVersion, wrong.Kind = "v1", "Node"
	r.Remember(wrong, r)
	if got := r.Share(typed(t, 2)); got == wrong || got.(*corev1.Pod).Kind != "Pod" {
		t.Error("a copy took a kind that is not its type's")
	}
	if unknown := (&metav1.Status{}); r.Share(unknown) != unknown || unknown.Kind != "" {
		t.Error("an object the registry does not hold was marked")
	}
}

// TestRegistryShareIsIdempotent: client-go's watch-list reflector runs an informer's transform twice on
// every object. The second pass over a copy whose parts already point at an older cached version, after the
// registry has moved on to a version decoded on its own, must leave it alone: writing there writes into the
// older version, which other goroutines read (the race detector catches the write through the reader).
func TestRegistryShareIsIdempotent(t *testing.T) {
	r := NewRegistry()
	v1 := fresh(t, 1)
	r.Remember(v1, r)
	copy1 := typed(t, 1)
	copy1.Spec.NodeName = "node-9"
	if got := r.Share(copy1); got != copy1 || unsafe.StringData(copy1.Spec.Containers[0].Image) != unsafe.StringData(v1.Spec.Containers[0].Image) {
		t.Fatal("the first pass did not share the copy's equal parts with v1")
	}
	r.Forget(fresh(t, 1))
	v2 := fresh(t, 1) // held now, sharing nothing with v1
	r.Remember(v2, r)

	image := unsafe.StringData(v1.Spec.Containers[0].Image)
	var wg sync.WaitGroup
	wg.Go(func() {
		for range 1000 {
			_ = len(v1.Spec.Containers[0].Image) // a cacher or another informer reading v1
		}
	})
	if got := r.Share(copy1); got != copy1 {
		t.Error("the second pass returned another object")
	}
	wg.Wait()
	if unsafe.StringData(v1.Spec.Containers[0].Image) != image || unsafe.StringData(copy1.Spec.Containers[0].Image) != image {
		t.Error("the second pass wrote into memory the first shared")
	}
	if r.Share(v2) != v2 {
		t.Error("the held object came back as another")
	}
}

// TestRegistrySiblings: a new object shares the memory of what it has in common with the last new object of
// its controller (a ReplicaSet's pods are copies of one template), keeps its own values, and a deleted
// sibling is no longer one; an object without a controller shares nothing.
func TestRegistrySiblings(t *testing.T) {
	r := NewRegistry()
	first, second := fresh(t, 1), fresh(t, 2)
	r.Remember(first, r)
	r.Remember(second, r)
	if unsafe.StringData(second.Spec.Containers[0].Image) != unsafe.StringData(first.Spec.Containers[0].Image) ||
		unsafe.SliceData(second.ManagedFields[0].FieldsV1.Raw) != unsafe.SliceData(first.ManagedFields[0].FieldsV1.Raw) {
		t.Error("a sibling does not share the template's memory")
	}
	if second.Name != fresh(t, 2).Name || first.Name != fresh(t, 1).Name {
		t.Errorf("names changed: %q, %q", first.Name, second.Name)
	}

	r.Forget(fresh(t, 2))
	third := fresh(t, 3)
	r.Remember(third, r)
	if unsafe.StringData(third.Spec.Containers[0].Image) == unsafe.StringData(second.Spec.Containers[0].Image) {
		t.Error("a new object shared memory with a deleted sibling")
	}

	orphan := fresh(t, 4)
	orphan.OwnerReferences = nil
	r.Remember(orphan, r)
	if unsafe.StringData(orphan.Spec.Containers[0].Image) == unsafe.StringData(third.Spec.Containers[0].Image) {
		t.Error("an object without a controller shared memory")
	}
}
