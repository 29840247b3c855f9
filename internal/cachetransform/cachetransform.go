// Package cachetransform holds the transforms Skiff's own informers apply to what they store.
package cachetransform

import (
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

// SharedWith is the transform of the informers on a server (cache.TransformFunc): what they store is the
// server's watch cache's copy of each object, or shares its memory where the cache holds a newer version
// (memshare.Registry.Share). They read the server's own API over loopback, so each would otherwise keep an
// object decoded afresh. The objects it returns are read-only. A tombstone stays as it is: its object is on
// its way out of the cache.
func SharedWith(r *memshare.Registry) cache.TransformFunc {
	return func(obj any) (any, error) {
		if _, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			return obj, nil
		}
		return r.Share(obj), nil
	}
}
