package controller

import (
	"context"
	"encoding/json"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// gcInterval is the shortest pause between two looks at the whole object graph. A round that takes long (a
// big cluster) stretches the pause to ten times its duration, so collection never takes more than a tenth
// of the leader's attention.
const gcInterval = 2 * time.Second

// gcObject is one node of the ownership graph.
type gcObject struct {
	gvr  schema.GroupVersionResource
	meta metav1.PartialObjectMetadata
}

// runGarbageCollector honours ownerReferences and the deletion propagation policies, as Kubernetes' garbage
// collector does. Each round, it reads every object's metadata (from the watch cache) and then:
//  1. an object being deleted with the "orphan" finalizer: its dependents lose the owner reference, then
//     the finalizer goes;
//  2. an object being deleted with the "foregroundDeletion" finalizer: its dependents are deleted, and once
//     none is left the finalizer goes;
//  3. an object all of whose owners are gone (checked live, by UID) is deleted in the background.
func runGarbageCollector(ctx context.Context, c *Clients) {
	for {
		start := time.Now()
		if err := gcRound(ctx, c); err != nil && ctx.Err() == nil {
			c.Logger.Warn("garbage collection round failed", "error", err)
		}
		took := time.Since(start)
		c.Logger.Debug("garbage collection round", "took", took)
		select {
		case <-ctx.Done():
			return
		case <-time.After(max(gcInterval, 10*took)):
		}
	}
}

// kindResource maps an owner reference's apiVersion and kind to the resource that serves it.
type kindResource map[schema.GroupVersionKind]schema.GroupVersionResource

// gcSnapshot is one reading of every object's metadata.
type gcSnapshot struct {
	kinds   kindResource
	objects []*gcObject
	byUID   map[types.UID]*gcObject
}

// readGraph lists the metadata of every resource that can be listed, patched and deleted. With
// resourceVersion "0" the lists come from the watch cache, each as fresh as its own cache; with "" each is
// a consistent read.
func readGraph(ctx context.Context, c *Clients, resourceVersion string) (*gcSnapshot, error) {
	lists, err := c.Discovery.ServerPreferredResources()
	if err != nil && len(lists) == 0 {
		return nil, err
	}
	g := &gcSnapshot{kinds: kindResource{}, byUID: map[types.UID]*gcObject{}}
	for _, l := range lists {
		gv, err := schema.ParseGroupVersion(l.GroupVersion)
		if err != nil {
			continue
		}
		for _, r := range l.APIResources {
			gvr := gv.WithResource(r.Name)
			g.kinds[gv.WithKind(r.Kind)] = gvr
			if !hasVerbs(r.Verbs, "list", "delete", "patch") {
				continue
			}
			list, err := c.Metadata.Resource(gvr).List(ctx, metav1.ListOptions{ResourceVersion: resourceVersion})
			if err != nil {
				continue
			}
			for i := range list.Items {
				o := &gcObject{gvr: gvr, meta: list.Items[i]}
				g.objects = append(g.objects, o)
				g.byUID[o.meta.UID] = o
			}
		}
	}
	return g, nil
}

// finalizing reports whether an object waits for the collector to orphan or delete its dependents.
func finalizing(o *gcObject) bool {
	return o.meta.DeletionTimestamp != nil &&
		(hasFinalizer(o, metav1.FinalizerOrphanDependents) || hasFinalizer(o, metav1.FinalizerDeleteDependents))
}

func gcRound(ctx context.Context, c *Clients) error {
	g, err := readGraph(ctx, c, "0")
	if err != nil {
		return err
	}
	// The cached lists are each as fresh as their own cache: the pods may have been read before a pod was
	// created and its owner's deletion after. Orphaning by such a reading would drop the owner's finalizer
	// without touching the new pod, which would then be collected as an orphan. So an owner's finalizer is
	// only ever handled on consistent reads, all made after its deletion was seen.
	for _, o := range g.objects {
		if finalizing(o) {
			if g, err = readGraph(ctx, c, ""); err != nil {
				return err
			}
			break
		}
	}
	objects, byUID, kinds := g.objects, g.byUID, g.kinds
	dependents := map[types.UID][]*gcObject{}
	for _, o := range objects {
		for _, ref := range o.meta.OwnerReferences {
			dependents[ref.UID] = append(dependents[ref.UID], o)
		}
	}
	for _, o := range objects {
		if o.meta.DeletionTimestamp != nil {
			if hasFinalizer(o, metav1.FinalizerOrphanDependents) {
				orphan(ctx, c, o, dependents[o.meta.UID])
			}
			if hasFinalizer(o, metav1.FinalizerDeleteDependents) {
				deleteDependents(ctx, c, o, dependents, byUID, kinds)
			}
			continue
		}
		if len(o.meta.OwnerReferences) > 0 && ownersGone(ctx, c, o, byUID, kinds) {
			background := metav1.DeletePropagationBackground
			uid := o.meta.UID
			err := c.Metadata.Resource(o.gvr).Namespace(o.meta.Namespace).Delete(ctx, o.meta.Name,
				metav1.DeleteOptions{PropagationPolicy: &background, Preconditions: &metav1.Preconditions{UID: &uid}})
			if err == nil {
				c.Logger.Info("deleted an object whose owners are gone", "resource", o.gvr.Resource, "namespace", o.meta.Namespace, "name", o.meta.Name)
			}
		}
	}
	return nil
}

// ownersGone reports whether none of the object's owners exists any more. An owner missing from this
// round's snapshot is looked up live before the object is condemned; one that cannot be looked up saves it.
func ownersGone(ctx context.Context, c *Clients, o *gcObject, byUID map[types.UID]*gcObject, kinds kindResource) bool {
	for _, ref := range o.meta.OwnerReferences {
		if exists, err := ownerExists(ctx, c, o, ref, byUID, kinds); exists || err != nil {
			return false
		}
	}
	return true
}

// ownerExists reports whether the owner ref names exists: in this round's snapshot, or else live, by UID.
// An owner of a kind this server does not serve counts as existing, so that nothing is collected on a guess;
// a lookup that fails says so, and the caller does nothing this round.
func ownerExists(ctx context.Context, c *Clients, o *gcObject, ref metav1.OwnerReference, byUID map[types.UID]*gcObject, kinds kindResource) (bool, error) {
	if _, ok := byUID[ref.UID]; ok {
		return true, nil
	}
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	if err != nil {
		return true, nil
	}
	gvr, ok := kinds[gv.WithKind(ref.Kind)]
	if !ok {
		return true, nil // an owner kind this server does not serve: leave the object alone
	}
	owner, err := c.Metadata.Resource(gvr).Namespace(o.meta.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	switch {
	case err == nil:
		return owner.UID == ref.UID, nil
	case apierrors.IsNotFound(err):
		return false, nil
	}
	// A cluster-scoped owner may refuse the namespaced path; look it up without a namespace.
	owner, err = c.Metadata.Resource(gvr).Get(ctx, ref.Name, metav1.GetOptions{})
	switch {
	case err == nil:
		return owner.UID == ref.UID, nil
	case apierrors.IsNotFound(err):
		return false, nil
	}
	return false, err
}

// waitingForDependents reports whether the object is being deleted in the foreground.
func waitingForDependents(o *gcObject) bool {
	return o.meta.DeletionTimestamp != nil && hasFinalizer(o, metav1.FinalizerDeleteDependents)
}

// keptBy returns the owner references of d to keep when an owner is deleted in the foreground: those to
// owners that exist and are not themselves waiting for their dependents' deletion (Kubernetes' "solid"
// owners). When there are any, d stays, without its references to the others. An owner that cannot be
// looked up is an error: the caller leaves d for the next round.
func keptBy(ctx context.Context, c *Clients, d *gcObject, byUID map[types.UID]*gcObject, kinds kindResource) ([]metav1.OwnerReference, error) {
	var solid []metav1.OwnerReference
	for _, ref := range d.meta.OwnerReferences {
		if o, ok := byUID[ref.UID]; ok && waitingForDependents(o) {
			continue
		}
		exists, err := ownerExists(ctx, c, d, ref, byUID, kinds)
		if err != nil {
			return nil, err
		}
		if exists {
			solid = append(solid, ref)
		}
	}
	return solid, nil
}

func orphan(ctx context.Context, c *Clients, owner *gcObject, deps []*gcObject) {
	for _, d := range deps {
		var keep []metav1.OwnerReference
		for _, ref := range d.meta.OwnerReferences {
			if ref.UID != owner.meta.UID {
				keep = append(keep, ref)
			}
		}
		if err := patchMeta(ctx, c, d, map[string]interface{}{"ownerReferences": keep}); err != nil && !apierrors.IsNotFound(err) {
			return // try again next round
		}
	}
	removeFinalizer(ctx, c, owner, metav1.FinalizerOrphanDependents)
}

// deleteDependents deletes an owner's dependents in the foreground, and drops the owner's finalizer once
// none that blocks it (blockOwnerDeletion) is left, as Kubernetes' collector does. A dependent that another
// owner still holds (keptBy) is not deleted: it loses its references to the owners being deleted. A dependent that has a
// dependent of its own in foreground deletion may be part of an ownership cycle (a owns b owns c owns a):
// its references stop blocking before it is deleted, so that the deletions cannot wait on each other
// forever (Kubernetes' rule, with the same false positives).
func deleteDependents(ctx context.Context, c *Clients, owner *gcObject, dependents map[types.UID][]*gcObject,
	byUID map[types.UID]*gcObject, kinds kindResource) {
	blocking := 0
	foreground := metav1.DeletePropagationForeground
	for _, d := range dependents[owner.meta.UID] {
		if d.meta.DeletionTimestamp != nil {
			if blocksOwner(d, owner.meta.UID) {
				blocking++
			}
			continue
		}
		keep, err := keptBy(ctx, c, d, byUID, kinds)
		if err != nil {
			blocking++ // an owner could not be looked up: try again next round
			continue
		}
		if len(keep) > 0 {
			if err := patchMeta(ctx, c, d, map[string]interface{}{"ownerReferences": keep}); err != nil && !apierrors.IsNotFound(err) {
				blocking++ // try again next round
			}
			continue
		}
		unblocked := false
		for _, dd := range dependents[d.meta.UID] {
			if dd.meta.DeletionTimestamp != nil && hasFinalizer(dd, metav1.FinalizerDeleteDependents) {
				if err := unblockOwners(ctx, c, d); err != nil && !apierrors.IsNotFound(err) {
					return // try again next round
				}
				unblocked = true
				break
			}
		}
		if !unblocked && blocksOwner(d, owner.meta.UID) {
			blocking++
		}
		c.Metadata.Resource(d.gvr).Namespace(d.meta.Namespace).Delete(ctx, d.meta.Name, metav1.DeleteOptions{PropagationPolicy: &foreground})
	}
	if blocking == 0 {
		removeFinalizer(ctx, c, owner, metav1.FinalizerDeleteDependents)
	}
}

// blocksOwner reports whether the object's reference to the owner blocks the owner's foreground deletion.
func blocksOwner(o *gcObject, owner types.UID) bool {
	for _, ref := range o.meta.OwnerReferences {
		if ref.UID == owner && ref.BlockOwnerDeletion != nil && *ref.BlockOwnerDeletion {
			return true
		}
	}
	return false
}

// unblockOwners sets blockOwnerDeletion false on every owner reference of the object.
func unblockOwners(ctx context.Context, c *Clients, o *gcObject) error {
	refs := make([]metav1.OwnerReference, len(o.meta.OwnerReferences))
	for i, ref := range o.meta.OwnerReferences {
		ref.BlockOwnerDeletion = new(false)
		refs[i] = ref
	}
	c.Logger.Info("an object in an ownership chain under foreground deletion stops blocking its owners, to break a possible cycle",
		"resource", o.gvr.Resource, "namespace", o.meta.Namespace, "name", o.meta.Name)
	return patchMeta(ctx, c, o, map[string]interface{}{"ownerReferences": refs})
}

func hasFinalizer(o *gcObject, f string) bool {
	for _, x := range o.meta.Finalizers {
		if x == f {
			return true
		}
	}
	return false
}

func removeFinalizer(ctx context.Context, c *Clients, o *gcObject, f string) {
	var keep []string
	for _, x := range o.meta.Finalizers {
		if x != f {
			keep = append(keep, x)
		}
	}
	if err := patchMeta(ctx, c, o, map[string]interface{}{"finalizers": keep}); err != nil && !apierrors.IsNotFound(err) {
		c.Logger.Warn("removing finalizer", "finalizer", f, "name", o.meta.Name, "error", err)
	}
}

// patchMeta merge-patches metadata fields, guarded by the resourceVersion that was read.
func patchMeta(ctx context.Context, c *Clients, o *gcObject, fields map[string]interface{}) error {
	fields["resourceVersion"] = o.meta.ResourceVersion
	body, err := json.Marshal(map[string]interface{}{"metadata": fields})
	if err != nil {
		return err
	}
	_, err = c.Metadata.Resource(o.gvr).Namespace(o.meta.Namespace).Patch(ctx, o.meta.Name, types.MergePatchType, body, metav1.PatchOptions{})
	return err
}
