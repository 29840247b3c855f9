package raftstore

import (
	"reflect"
	"testing"
	"time"
	"unsafe"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	"k8s.io/apiserver/pkg/storage"
)

// TestWholeResourceWatchSharesUnchangedParts: the watch cache's watch (a whole resource, unfiltered) sends
// each new version of an object sharing the memory of what it has in common with the version before, the
// deleted object included; the values are the stored ones.
func TestWholeResourceWatchSharesUnchangedParts(t *testing.T) {
	ctx, s, _ := testSetup(t)
	w, err := s.Watch(ctx, "/pods/", storage.ListOptions{ResourceVersion: "1", Recursive: true, Predicate: storage.Everything})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	pod := &example.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns", Labels: map[string]string{"app": "web"}},
		Spec:       example.PodSpec{NodeSelector: map[string]string{"disk": "ssd"}, ServiceAccountName: "builder"},
	}
	out := &example.Pod{}
	if err := s.Create(ctx, "/pods/ns/web", pod, out, 0); err != nil {
		t.Fatal(err)
	}
	update := func(change func(*example.Pod)) {
		t.Helper()
		if err := s.GuaranteedUpdate(ctx, "/pods/ns/web", &example.Pod{}, false, nil, func(in runtime.Object, _ storage.ResponseMeta) (runtime.Object, *uint64, error) {
			p := in.(*example.Pod).DeepCopy()
			change(p)
			return p, nil, nil
		}, nil); err != nil {
			t.Fatal(err)
		}
	}
	update(func(p *example.Pod) { p.Spec.NodeName = "node-1" })
	update(func(p *example.Pod) { p.Status.Phase = "Running" })
	if err := s.Delete(ctx, "/pods/ns/web", &example.Pod{}, nil, storage.ValidateAllObjectFunc, nil, storage.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var got []*example.Pod
	for len(got) < 4 {
		select {
		case ev := <-w.ResultChan():
			if ev.Type == watch.Error {
				t.Fatalf("watch error: %v", ev.Object)
			}
			got = append(got, ev.Object.(*example.Pod))
		case <-time.After(10 * time.Second):
			t.Fatalf("got %d of 4 events", len(got))
		}
	}
	if got[1].Spec.NodeName != "node-1" || got[2].Status.Phase != "Running" || got[2].Spec.NodeName != "node-1" {
		t.Fatalf("the versions do not hold what was written: %+v", got)
	}
	for i := 1; i < len(got); i++ {
		if reflect.ValueOf(got[i].Spec.NodeSelector).UnsafePointer() != reflect.ValueOf(got[i-1].Spec.NodeSelector).UnsafePointer() ||
			unsafe.StringData(got[i].Spec.ServiceAccountName) != unsafe.StringData(got[i-1].Spec.ServiceAccountName) {
			t.Errorf("version %d does not share its unchanged spec with version %d", i, i-1)
		}
	}

	// A watch of one object keeps nothing.
	one, err := s.Watch(ctx, "/pods/ns/web", storage.ListOptions{ResourceVersion: "1", Predicate: storage.Everything})
	if err != nil {
		t.Fatal(err)
	}
	defer one.Stop()
	if one.(*watchChan).remembers {
		t.Fatal("a watch of one key keeps objects")
	}
}

// TestWholeResourceWatchHoldsWhatItSent: the watch cache's watch holds in the store's registry the version
// of each object it sent last, so that an informer's copy can share it; a deleted object goes, and so does
// everything when the watch ends.
func TestWholeResourceWatchHoldsWhatItSent(t *testing.T) {
	ctx, s, _ := testSetup(t)
	w, err := s.Watch(ctx, "/pods/", storage.ListOptions{ResourceVersion: "1", Recursive: true, Predicate: storage.Everything})
	if err != nil {
		t.Fatal(err)
	}
	next := func() *example.Pod {
		t.Helper()
		select {
		case ev := <-w.ResultChan():
			return ev.Object.(*example.Pod)
		case <-time.After(10 * time.Second):
			t.Fatal("no event")
		}
		return nil
	}
	for _, name := range []string{"a", "b"} {
		pod := &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"}, Spec: example.PodSpec{NodeName: "n1"}}
		if err := s.Create(ctx, "/pods/ns/"+name, pod, &example.Pod{}, 0); err != nil {
			t.Fatal(err)
		}
	}
	sent := next()
	next()
	// An informer's copy of a, decoded on its own, comes back as the very object the watch sent.
	copyOfA := &example.Pod{ObjectMeta: *sent.ObjectMeta.DeepCopy(), Spec: example.PodSpec{NodeName: "n1"}}
	if got := s.shared.Share(copyOfA); got != sent {
		t.Fatalf("the registry does not hold what the watch sent: %p, sent %p", got, sent)
	}
	if err := s.Delete(ctx, "/pods/ns/a", &example.Pod{}, nil, storage.ValidateAllObjectFunc, nil, storage.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	next()
	if n := s.shared.Len(); n != 1 {
		t.Fatalf("after a's deletion the registry holds %d objects, want 1", n)
	}
	w.Stop()
	deadline := time.Now().Add(10 * time.Second)
	for s.shared.Len() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("an ended watch still holds %d objects", s.shared.Len())
		}
		time.Sleep(10 * time.Millisecond)
	}
}
