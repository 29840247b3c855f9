package controller

import (
	"context"
	"encoding/json"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/client-go/tools/cache"
)

// ownerByRef returns the cached owner a controller reference names; false when it names another kind, or an
// owner that no longer exists or was recreated under the same name (another UID).
func ownerByRef[T metav1.Object](ref *metav1.OwnerReference, kind string, get func(name string) (T, error)) (T, bool) {
	var none T
	if ref.Kind != kind {
		return none, false
	}
	owner, err := get(ref.Name)
	if err != nil || owner.GetUID() != ref.UID {
		return none, false
	}
	return owner, true
}

// selectingLabels returns the owners whose selector matches a dependent's labels. An empty or invalid
// selector matches nothing: it would match everything, and Kubernetes never lets such an owner adopt.
func selectingLabels[T any](owners []T, selectorOf func(T) *metav1.LabelSelector, dependentLabels map[string]string) []T {
	var out []T
	for _, o := range owners {
		selector, err := metav1.LabelSelectorAsSelector(selectorOf(o))
		if err == nil && !selector.Empty() && selector.Matches(labels.Set(dependentLabels)) {
			out = append(out, o)
		}
	}
	return out
}

// fromTombstone returns the object of a delete event, unwrapping the informer's tombstone for a delete it
// missed.
func fromTombstone[T any](obj any) (T, bool) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	o, ok := obj.(T)
	return o, ok
}

// claimer makes the ownership of a controller's dependents (a ReplicaSet's pods, a Deployment's ReplicaSets)
// agree with its selector, as Kubernetes' ControllerRefManager does.
type claimer struct {
	owner     metav1.Object
	ownerKind schema.GroupVersionKind
	selector  labels.Selector
	// dependentKind names the dependents in errors ("Pod", "ReplicaSet").
	dependentKind string
	// liveOwner reads the owner from the API, not the cache.
	liveOwner func(context.Context) (metav1.Object, error)
	// patch applies a strategic merge patch to the dependent named namespace/name.
	patch func(ctx context.Context, namespace, name string, patch []byte) error

	adoptionChecked bool
	adoptionErr     error
}

// claim returns the dependents that belong to the owner, making ownership agree with the selector on the way:
// an owned dependent the selector no longer matches is released; an orphan it matches is adopted. Those
// another controller owns are left alone. An owner being deleted neither adopts nor releases: its dependents
// are about to be collected.
func claim[T metav1.Object](ctx context.Context, c *claimer, dependents []T) ([]T, error) {
	var claimed []T
	var errs []error
	deleting := c.owner.GetDeletionTimestamp() != nil
	for _, obj := range dependents {
		matches := c.selector.Matches(labels.Set(obj.GetLabels()))
		ref := metav1.GetControllerOfNoCopy(obj)
		switch {
		case ref != nil && ref.UID != c.owner.GetUID():
			// another controller's
		case ref != nil && matches:
			claimed = append(claimed, obj)
		case ref != nil:
			if !deleting {
				if err := c.release(ctx, obj); err != nil {
					errs = append(errs, err)
				}
			}
		case !matches || deleting || obj.GetDeletionTimestamp() != nil:
			// an orphan that is not ours to take
		default:
			if err := c.mayAdopt(ctx); err != nil {
				errs = append(errs, fmt.Errorf("can't adopt %s %s/%s (%s): %w", c.dependentKind, obj.GetNamespace(), obj.GetName(), obj.GetUID(), err))
				continue
			}
			if err := c.adopt(ctx, obj); err != nil {
				if !apierrors.IsNotFound(err) {
					errs = append(errs, err)
				}
				continue
			}
			claimed = append(claimed, obj)
		}
	}
	return claimed, utilerrors.NewAggregate(errs)
}

// mayAdopt reads the owner live once, before the first adoption: the cache may not show yet that it was
// deleted, or deleted and recreated, and a dying owner must not take dependents it would leave to the
// garbage collector.
func (c *claimer) mayAdopt(ctx context.Context) error {
	if c.adoptionChecked {
		return c.adoptionErr
	}
	c.adoptionChecked = true
	fresh, err := c.liveOwner(ctx)
	name := c.owner.GetNamespace() + "/" + c.owner.GetName()
	switch {
	case err != nil:
		c.adoptionErr = err
	case fresh.GetUID() != c.owner.GetUID():
		c.adoptionErr = fmt.Errorf("original %s %s is gone: got uid %s, wanted %s", c.ownerKind.Kind, name, fresh.GetUID(), c.owner.GetUID())
	case fresh.GetDeletionTimestamp() != nil:
		c.adoptionErr = fmt.Errorf("%s %s has just been deleted at %v", c.ownerKind.Kind, name, fresh.GetDeletionTimestamp())
	}
	return c.adoptionErr
}

// adopt makes the owner the dependent's controller. The patch carries the dependent's UID, so it fails rather
// than adopt one recreated under the same name; and the API refuses a second controller reference, so two
// controllers cannot both adopt it.
func (c *claimer) adopt(ctx context.Context, obj metav1.Object) error {
	return c.patchOwnerRefs(ctx, obj, []metav1.OwnerReference{*metav1.NewControllerRef(c.owner, c.ownerKind)})
}

// release removes the owner's reference from the dependent (by owner UID, leaving any other owner).
func (c *claimer) release(ctx context.Context, obj metav1.Object) error {
	err := c.patchOwnerRefs(ctx, obj, []map[string]any{{"$patch": "delete", "uid": c.owner.GetUID()}})
	if apierrors.IsNotFound(err) || apierrors.IsInvalid(err) {
		// Gone, or recreated under the same name (the UID in the patch no longer matches): either way it is
		// not ours any more.
		return nil
	}
	return err
}

func (c *claimer) patchOwnerRefs(ctx context.Context, obj metav1.Object, refs any) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"uid": obj.GetUID(), "ownerReferences": refs}})
	if err != nil {
		return err
	}
	return c.patch(ctx, obj.GetNamespace(), obj.GetName(), patch)
}
