package admission

import (
	"context"
	"slices"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apiserver/pkg/admission"
	storagelisters "k8s.io/client-go/listers/storage/v1"
)

// Annotations that mark the default StorageClass: the GA one and the beta one older manifests carry.
const (
	isDefaultClassAnnotation     = "storageclass.kubernetes.io/is-default-class"
	betaIsDefaultClassAnnotation = "storageclass.beta.kubernetes.io/is-default-class"
)

// IsDefaultStorageClass says whether a StorageClass is marked default (the `kubectl get sc` column says so too).
func IsDefaultStorageClass(sc *storagev1.StorageClass) bool {
	return sc.Annotations[isDefaultClassAnnotation] == "true" || sc.Annotations[betaIsDefaultClassAnnotation] == "true"
}

// defaultStorageClass is Kubernetes' DefaultStorageClass admission, written again on v1 objects (the
// library's casts to kube's internal claim): a claim created without spec.storageClassName gets the default
// class; when several classes are default, the newest wins (then the first by name), as in Kubernetes. A
// claim that names "" explicitly keeps it: it asks for a pre-provisioned volume without a class.
type defaultStorageClass struct {
	*admission.Handler
	classes storagelisters.StorageClassLister
}

var _ admission.MutationInterface = &defaultStorageClass{}

func newDefaultStorageClass(classes storagelisters.StorageClassLister) *defaultStorageClass {
	return &defaultStorageClass{Handler: admission.NewHandler(admission.Create), classes: classes}
}

func (d *defaultStorageClass) Admit(_ context.Context, a admission.Attributes, _ admission.ObjectInterfaces) error {
	if a.GetResource().GroupResource() != corev1.Resource("persistentvolumeclaims") || a.GetSubresource() != "" {
		return nil
	}
	claim, ok := a.GetObject().(*corev1.PersistentVolumeClaim)
	if !ok || claim.Spec.StorageClassName != nil {
		return nil
	}
	classes, err := d.classes.List(labels.Everything())
	if err != nil {
		return admission.NewForbidden(a, err)
	}
	var chosen *storagev1.StorageClass
	for _, sc := range classes {
		if !IsDefaultStorageClass(sc) {
			continue
		}
		if chosen == nil || sc.CreationTimestamp.After(chosen.CreationTimestamp.Time) ||
			(sc.CreationTimestamp.Equal(&chosen.CreationTimestamp) && sc.Name < chosen.Name) {
			chosen = sc
		}
	}
	if chosen != nil {
		name := chosen.Name
		claim.Spec.StorageClassName = &name
	}
	return nil
}

// Finalizers that keep a claim while a pod uses it and a volume while a claim is bound to it; Kubernetes'
// pvc-protection and pv-protection controllers remove them (controller/persistentvolume.go).
const (
	pvcProtectionFinalizer = "kubernetes.io/pvc-protection"
	pvProtectionFinalizer  = "kubernetes.io/pv-protection"
)

// storageObjectInUseProtection is Kubernetes' StorageObjectInUseProtection admission, written again on v1
// objects: every new claim and volume gets its protection finalizer, so deleting a claim a running pod
// mounts waits for the pod, and a bound volume waits for its claim.
type storageObjectInUseProtection struct{ *admission.Handler }

var _ admission.MutationInterface = storageObjectInUseProtection{}

func newStorageObjectInUseProtection() storageObjectInUseProtection {
	return storageObjectInUseProtection{admission.NewHandler(admission.Create)}
}

func (storageObjectInUseProtection) Admit(_ context.Context, a admission.Attributes, _ admission.ObjectInterfaces) error {
	if a.GetSubresource() != "" {
		return nil
	}
	var m metav1.Object
	var finalizer string
	switch obj := a.GetObject().(type) {
	case *corev1.PersistentVolumeClaim:
		m, finalizer = obj, pvcProtectionFinalizer
	case *corev1.PersistentVolume:
		m, finalizer = obj, pvProtectionFinalizer
	default:
		return nil
	}
	if !slices.Contains(m.GetFinalizers(), finalizer) {
		m.SetFinalizers(append(m.GetFinalizers(), finalizer))
	}
	return nil
}
