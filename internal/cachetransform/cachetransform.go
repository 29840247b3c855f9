// Package cachetransform holds the transforms Skiff's own informers apply to what they store.
package cachetransform

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/tools/cache"

	"github.com/skiff-dev/skiff/internal/memshare"
)

// StripManagedFields drops an object's managed fields before an informer stores it (cache.TransformFunc).
// They serve server-side apply, which the API server computes from its own copy; no controller, admission
// plugin or authorizer reads them, and in a cache of pods they are about a third of each object's memory.
// An object read from such a cache and sent back in an update keeps its stored managed fields: the API server
// takes the live object's when an update carries none, as kube-apiserver does.
func StripManagedFields(obj any) (any, error) {
	inner := obj
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		inner = tomb.Obj // the tombstone itself goes back: the informer's delete handlers expect it
	}
	if m, err := meta.Accessor(inner); err == nil && m.GetManagedFields() != nil {
		m.SetManagedFields(nil)
	}
	return obj, nil
}

// ForAPIServer is the transform of the API server's own informers (cache.TransformFunc): managed fields
// dropped, and a pod's status too but for its resource claim statuses. Their readers, the Node authorizer's
// graph, NodeRestriction and PodSecurity, read a pod's metadata and spec; the graph also reads the names of
// the claims generated for it, which only its status holds (both kinds of claim status). The rest of the
// status (conditions, IPs, every container's state) is a quarter of a pod, and each server keeps every pod
// of the cluster in this cache.
func ForAPIServer(obj any) (any, error) {
	obj, _ = StripManagedFields(obj)
	inner := obj
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		inner = tomb.Obj
	}
	if pod, ok := inner.(*corev1.Pod); ok {
		pod.Status = corev1.PodStatus{ResourceClaimStatuses: pod.Status.ResourceClaimStatuses,
			ExtendedResourceClaimStatus: pod.Status.ExtendedResourceClaimStatus}
	}
	return obj, nil
}

// SharedWith is the transform that makes what an informer on a server stores share the memory of the
// server's watch cache's copy (memshare.Registry.Share): the informer reads the server's own API over
// loopback, so it decodes each object afresh. It must come last: the objects it returns are read-only. A
// tombstone stays as it is: its object is on its way out of the cache.
func SharedWith(r *memshare.Registry) cache.TransformFunc {
	return func(obj any) (any, error) {
		if _, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			return obj, nil
		}
		return r.Share(obj), nil
	}
}

// Then is the transform that applies each of fs in turn.
func Then(fs ...cache.TransformFunc) cache.TransformFunc {
	return func(obj any) (any, error) {
		var err error
		for _, f := range fs {
			if obj, err = f(obj); err != nil {
				return nil, err
			}
		}
		return obj, nil
	}
}
