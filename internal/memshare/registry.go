package memshare

import (
	"reflect"
	"slices"
	"sync"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
)

// Registry holds the version of each object that a server's watch caches hold now, by type, namespace and
// name, so that other copies of it decoded in the same process share its memory.
//
// Why: a server keeps a pod once in its watch cache and again in the informers of its own API server
// (admission, the authorizers) and, on the leader, of its controllers and scheduler. Those informers read
// the server's own API over loopback, so each decodes every object afresh: three or four decoded copies of
// every pod of the cluster in one process. A copy whose values equal the cache's shares them instead
// (With), and a copy equal throughout is the cache's object itself.
//
// The watch that feeds a watch cache remembers each object it sends and forgets deleted ones; an informer's
// transform shares what it decoded. Objects in the registry are read-only, as the watch cache's already are.
// Safe for concurrent use.
type Registry struct {
	mu     sync.RWMutex
	byType map[reflect.Type]map[string]held
	// siblings holds, by type and controller, the object of that controller remembered last when it was new:
	// a new object shares the memory of what it has in common with its sibling. The pods of a ReplicaSet,
	// a Job or a DaemonSet are copies of one template: spec, labels, owner and the controller's managed
	// fields (a third of a decoded pod) are equal in all of them.
	siblings map[reflect.Type]map[types.UID]any
}

// held is one remembered object and the watch that remembered it.
type held struct {
	obj   any
	owner any
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{byType: map[reflect.Type]map[string]held{}, siblings: map[reflect.Type]map[types.UID]any{}}
}

// key is obj's type and "namespace/name", as an informer keys it; ok is false for what has no object
// metadata.
func key(obj any) (reflect.Type, string, bool) {
	m, err := meta.Accessor(obj)
	if err != nil || obj == nil {
		return nil, "", false
	}
	if ns := m.GetNamespace(); ns != "" {
		return reflect.TypeOf(obj), ns + "/" + m.GetName(), true
	}
	return reflect.TypeOf(obj), m.GetName(), true
}

// controllerOf is the UID of obj's controller, "" when it has none.
func controllerOf(obj any) types.UID {
	m, err := meta.Accessor(obj)
	if err != nil {
		return ""
	}
	if ref := metav1.GetControllerOfNoCopy(m); ref != nil {
		return ref.UID
	}
	return ""
}

func (r *Registry) get(t reflect.Type, k string) (held, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	h, ok := r.byType[t][k]
	return h, ok
}

// Remember makes obj, a new version its owner (a watch) is about to hand on, share memory with the version
// held before it (or, new, with its sibling), and holds obj in its place.
func (r *Registry) Remember(obj, owner any) {
	t, k, ok := key(obj)
	if !ok {
		return
	}
	prev, known := r.get(t, k)
	ctrl := types.UID("")
	if known {
		With(obj, prev.obj)
	} else if ctrl = controllerOf(obj); ctrl != "" {
		r.mu.RLock()
		sibling := r.siblings[t][ctrl]
		r.mu.RUnlock()
		if sibling != nil {
			With(obj, sibling)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	byKey := r.byType[t]
	if byKey == nil {
		byKey = map[string]held{}
		r.byType[t] = byKey
	}
	byKey[k] = held{obj: obj, owner: owner}
	if ctrl != "" {
		bySibling := r.siblings[t]
		if bySibling == nil {
			bySibling = map[types.UID]any{}
			r.siblings[t] = bySibling
		}
		bySibling[ctrl] = obj
	}
}

// Forget drops the object held under obj's type and name (it was deleted), after obj shares memory with it.
func (r *Registry) Forget(obj any) {
	t, k, ok := key(obj)
	if !ok {
		return
	}
	prev, known := r.get(t, k)
	if known {
		With(obj, prev.obj)
	}
	ctrl := controllerOf(obj)
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.byType[t], k)
	if known && ctrl != "" && r.siblings[t][ctrl] == prev.obj {
		delete(r.siblings[t], ctrl)
	}
}

// Release drops every object owner remembered and no other owner remembered since: a watch that ended no
// longer learns of their changes or deletion.
func (r *Registry) Release(owner any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	clear(r.siblings) // hints only: a watch still running finds new ones as it goes
	for _, byKey := range r.byType {
		for k, h := range byKey {
			if h.owner == owner {
				delete(byKey, k)
			}
		}
	}
}

// Share returns obj, sharing the memory of the version held under its type and name wherever their values
// are equal; or the held object itself when they are equal throughout. obj must not be changed afterwards.
// It suits an informer's transform (cache.TransformFunc) on a server, run after any transform that changes
// the object.
//
// obj is what a typed client decodes, without apiVersion and kind; the watch cache's objects carry theirs
// (the storage codec sets them as it decodes). Share gives obj its kind before comparing, so that an equal
// copy is the cache's object, and leaves it set on what it has shared: an object that carries its kind is
// returned as it is. That makes Share idempotent, which client-go requires of a transform its watch-list
// reflector runs twice on every object (into its temporary store, then again in Replace): a second pass over
// an object that already shares the watch cache's memory would write into that memory, which the cacher
// and the other informers read meanwhile. An object whose kind is not known (neither its type's in the
// client's scheme nor carried by the held one) is shared whole or not at all.
func (r *Registry) Share(obj any) any {
	if r == nil {
		return obj
	}
	o, ok := obj.(runtime.Object)
	if !ok || !o.GetObjectKind().GroupVersionKind().Empty() {
		return obj
	}
	t, k, ok := key(obj)
	if !ok {
		return obj
	}
	prev, ok := r.get(t, k)
	if !ok {
		return obj // nothing shared: obj is still its own, and a later pass may share it
	}
	gvk, ok := kindFor(o, prev.obj)
	if !ok {
		// Nothing to mark obj with: the whole of it or nothing, so that a second pass has nothing to write.
		if reflect.DeepEqual(obj, prev.obj) {
			return prev.obj
		}
		return obj
	}
	o.GetObjectKind().SetGroupVersionKind(gvk)
	if With(obj, prev.obj) {
		return prev.obj
	}
	return obj
}

// kindFor is obj's kind: in the client's scheme, the one held carries when it is one of obj's type's, else
// the type's only one; for a type that scheme does not know (an API server's own test types), the one held
// carries.
func kindFor(obj runtime.Object, held any) (schema.GroupVersionKind, bool) {
	var heldKind schema.GroupVersionKind
	if h, ok := held.(runtime.Object); ok {
		heldKind = h.GetObjectKind().GroupVersionKind()
	}
	kinds, _, err := scheme.Scheme.ObjectKinds(obj)
	switch {
	case runtime.IsNotRegisteredError(err):
		return heldKind, !heldKind.Empty()
	case err != nil || len(kinds) == 0:
		return schema.GroupVersionKind{}, false
	case slices.Contains(kinds, heldKind):
		return heldKind, true
	case len(kinds) == 1:
		return kinds[0], true
	}
	return schema.GroupVersionKind{}, false
}

// Len is how many objects the registry holds.
func (r *Registry) Len() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	n := 0
	for _, byKey := range r.byType {
		n += len(byKey)
	}
	return n
}
