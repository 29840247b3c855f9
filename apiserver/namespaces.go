package apiserver

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/apiserver/pkg/storage"
)

// Namespace deletion works as in Kubernetes: a namespace with spec.finalizers is not removed by DELETE but
// marked (deletionTimestamp, phase Terminating); the namespace controller empties it and removes its
// finalizer through the finalize subresource; the last finalizer removed removes the namespace.

type namespaceREST struct{ *resource }

func (r *namespaceREST) Delete(ctx context.Context, name string, deleteValidation rest.ValidateObjectFunc, options *metav1.DeleteOptions) (runtime.Object, bool, error) {
	obj, err := r.Store.Get(ctx, name, &metav1.GetOptions{})
	if err != nil {
		return nil, false, err
	}
	ns := obj.(*corev1.Namespace)
	if options == nil {
		options = &metav1.DeleteOptions{}
	}
	if options.Preconditions != nil {
		if uid := options.Preconditions.UID; uid != nil && *uid != ns.UID {
			return nil, false, apierrors.NewConflict(corev1.Resource("namespaces"), name, fmt.Errorf("precondition failed: UID in precondition: %v, UID in object meta: %v", *uid, ns.UID))
		}
	}
	if len(ns.Spec.Finalizers) == 0 {
		return r.Store.Delete(ctx, name, deleteValidation, options)
	}
	if deleteValidation != nil {
		if err := deleteValidation(ctx, ns); err != nil {
			return nil, false, err
		}
	}
	key, err := r.Store.KeyFunc(ctx, name)
	if err != nil {
		return nil, false, err
	}
	out := &corev1.Namespace{}
	err = r.Store.Storage.GuaranteedUpdate(ctx, key, out, false, &storage.Preconditions{UID: &ns.UID}, storage.SimpleUpdate(func(o runtime.Object) (runtime.Object, error) {
		ns := o.(*corev1.Namespace)
		if ns.DeletionTimestamp == nil {
			now := metav1.Now()
			zero := int64(0)
			ns.DeletionTimestamp = &now
			ns.DeletionGracePeriodSeconds = &zero
		}
		ns.Status.Phase = corev1.NamespaceTerminating
		return ns, nil
	}), len(options.DryRun) > 0, nil)
	if err != nil {
		return nil, false, err
	}
	return out, false, nil
}

// shouldDeleteNamespaceDuringUpdate is the library's rule (a terminating object with no finalizers left goes
// at its update) with the namespace's spec.finalizers counted too, as kube-apiserver's namespace storage has it.
func shouldDeleteNamespaceDuringUpdate(ctx context.Context, key string, obj, existing runtime.Object) bool {
	ns, ok := obj.(*corev1.Namespace)
	return ok && len(ns.Spec.Finalizers) == 0 && genericregistry.ShouldDeleteDuringUpdate(ctx, key, obj, existing)
}

// finalizeREST is namespaces/{name}/finalize: it changes spec.finalizers only.
type finalizeREST struct{ store *genericregistry.Store }

func (r *finalizeREST) New() runtime.Object { return &corev1.Namespace{} }
func (r *finalizeREST) Destroy()            {}

func (r *finalizeREST) Update(ctx context.Context, name string, objInfo rest.UpdatedObjectInfo, createValidation rest.ValidateObjectFunc,
	updateValidation rest.ValidateObjectUpdateFunc, forceAllowCreate bool, options *metav1.UpdateOptions) (runtime.Object, bool, error) {
	key, err := r.store.KeyFunc(ctx, name)
	if err != nil {
		return nil, false, err
	}
	dryRun := options != nil && len(options.DryRun) > 0
	out := &corev1.Namespace{}
	err = r.store.Storage.GuaranteedUpdate(ctx, key, out, false, nil, func(o runtime.Object, _ storage.ResponseMeta) (runtime.Object, *uint64, error) {
		old := o.(*corev1.Namespace)
		updated, err := objInfo.UpdatedObject(ctx, old.DeepCopy())
		if err != nil {
			return nil, nil, err
		}
		ns := old.DeepCopy()
		ns.Spec.Finalizers = updated.(*corev1.Namespace).Spec.Finalizers
		if updateValidation != nil {
			if err := updateValidation(ctx, ns, old); err != nil {
				return nil, nil, err
			}
		}
		return ns, nil, nil
	}, dryRun, nil)
	if err != nil {
		return nil, false, err
	}
	if out.DeletionTimestamp != nil && len(out.Spec.Finalizers) == 0 && len(out.Finalizers) == 0 {
		uid := out.UID
		deleted := &corev1.Namespace{}
		if err := r.store.Storage.Delete(ctx, key, deleted, &storage.Preconditions{UID: &uid}, storage.ValidateAllObjectFunc, dryRun, nil, storage.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return nil, false, err
		}
		return deleted, false, nil
	}
	return out, false, nil
}
