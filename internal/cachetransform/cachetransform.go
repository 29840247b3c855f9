// Package cachetransform holds the transforms Skiff's own informers apply to what they store.
package cachetransform

import (
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/tools/cache"
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
