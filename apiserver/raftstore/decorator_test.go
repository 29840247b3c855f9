package raftstore

import (
	"context"
	"testing"
	"time"

	apitesting "k8s.io/apimachinery/pkg/api/apitesting"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/storagebackend"

	rt "github.com/skiff-dev/skiff/raftnode/raftnodetest"
)

// TestDecoratorWaitsForTheWatchCache: a storage built with WaitReady serves a list from its watch cache at
// once, where a cache still on its first list refuses one without a limit (429, "storage is
// (re)initializing"), which in-process callers such as apiextensions' CRD finalizer do not retry. (The
// list asks for resourceVersion 0, which the cache serves in any configuration; the finalizer's consistent
// list is served from it too on a server.)
func TestDecoratorWaitsForTheWatchCache(t *testing.T) {
	c := rt.TestCluster(t, 1)
	cfg := &storagebackend.ConfigForResource{
		Config: storagebackend.Config{Prefix: "/registry", Codec: apitesting.TestCodec(codecs, examplev1.SchemeGroupVersion),
			EventsHistoryWindow: storagebackend.DefaultEventsHistoryWindow},
		GroupResource: schema.GroupResource{Resource: "pods"},
	}
	keyFunc := func(obj runtime.Object) (string, error) { return storage.NamespaceKeyFunc("/pods", obj) }
	for i := range 5 {
		s, destroy, err := Decorator(c.Node(0), CacheOptions{WaitReady: 5 * time.Second})(cfg, "/pods", keyFunc,
			func() runtime.Object { return &example.Pod{} }, func() runtime.Object { return &example.PodList{} },
			storage.DefaultNamespaceScopedAttr, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		err = s.GetList(context.Background(), "/pods", storage.ListOptions{ResourceVersion: "0", Recursive: true, Predicate: storage.Everything}, &example.PodList{})
		destroy()
		if err != nil {
			t.Fatalf("storage %d: a list as soon as it is built: %v", i, err)
		}
	}
}
