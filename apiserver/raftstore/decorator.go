package raftstore

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/registry/generic"
	"k8s.io/apiserver/pkg/storage"
	cacherstorage "k8s.io/apiserver/pkg/storage/cacher"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/apiserver/pkg/storage/storagebackend/factory"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/skiff-dev/skiff/internal/memshare"
)

// Decorator builds one resource's storage for the library's generic registry: the Raft store, encoding with
// the codec the registry hands it (a typed scheme's for built-in kinds, apiextensions' per-version codec for
// custom resources), with the library's watch cache on top, exactly as kube-apiserver puts the cacher on
// etcd (registry.StorageWithCacher). Every server of the chain gets its storage from it.
func Decorator(backend Backend, opts CacheOptions) generic.StorageDecorator {
	return func(config *storagebackend.ConfigForResource, prefix string,
		keyFunc func(obj runtime.Object) (string, error), newFunc, newListFunc func() runtime.Object,
		getAttrs storage.AttrFunc, triggers storage.IndexerFuncs, indexers *cache.Indexers) (storage.Interface, factory.DestroyFunc, error) {
		raw := New(Config{
			Backend: backend, Codec: config.Codec, Prefix: config.Prefix, ResourcePrefix: prefix,
			GroupResource: config.GroupResource, NewFunc: newFunc, NewListFunc: newListFunc, Transformer: config.Transformer,
			Shared: opts.Shared,
		})
		cacher, err := cacherstorage.NewCacherFromConfig(cacherstorage.Config{
			Storage: raw, Versioner: storage.APIObjectVersioner{}, GroupResource: config.GroupResource,
			EventsHistoryWindow: config.EventsHistoryWindow, ResourcePrefix: prefix, KeyFunc: keyFunc,
			NewFunc: newFunc, NewListFunc: newListFunc, GetAttrsFunc: getAttrs, IndexerFuncs: triggers,
			Indexers: indexers, Codec: config.Codec,
		})
		if err != nil {
			return nil, func() {}, err
		}
		delegator := cacherstorage.NewCacheDelegator(cacher, raw)
		waitReady(cacher, opts.WaitReady)
		var once sync.Once
		return delegator, func() {
			once.Do(func() {
				delegator.Stop()
				// The library's Cacher.Stop waits for its reflector, which can be blocked for good sending a
				// bookmark to the event channel that the cacher's dispatcher, already stopped, no longer drains
				// (cacher.go processEvent). A stopping server (or a custom resource's storage replaced when its
				// CRD changes) must not hang on it: wait a bounded time.
				stopped := make(chan struct{})
				go func() {
					cacher.Stop()
					close(stopped)
				}()
				select {
				case <-stopped:
				case <-time.After(cacherStopTimeout):
					klog.InfoS("the watch cache did not stop in time; leaving it", "resource", config.GroupResource)
				}
			})
		}, nil
	}
}

// CacheOptions are how Decorator builds a resource's watch cache.
type CacheOptions struct {
	// Shared, when not nil, holds the watch cache's objects for the server's informers to share
	// (memshare.Registry).
	Shared *memshare.Registry
	// WaitReady is how long building the storage waits for the watch cache's first list, for a storage built
	// on a request's way (a custom resource's, on a server's first request for it). Until its cache is ready,
	// a list without a limit is refused with 429 "storage is (re)initializing", and in-process callers do not
	// retry: apiextensions' CRD finalizer, listing the instances to delete, gave up on the first refusal, then
	// lost a write conflict with another server's finalizer and waited for its informer's resync (5 minutes)
	// with the CRD stuck in deletion.
	WaitReady time.Duration
}

// waitReady waits up to d for cacher's first list.
func waitReady(cacher *cacherstorage.Cacher, d time.Duration) {
	for deadline := time.Now().Add(d); !cacher.Ready() && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
}

// cacherStopTimeout bounds how long a server's shutdown waits for one resource's watch cache.
const cacherStopTimeout = 2 * time.Second
