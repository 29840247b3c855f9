package apiserver

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apiserver/pkg/admission"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/kubernetes/pkg/apis/core"
	kubecorev1 "k8s.io/kubernetes/pkg/apis/core/v1"
	"k8s.io/kubernetes/pkg/apis/storage"
	kubestoragev1 "k8s.io/kubernetes/pkg/apis/storage/v1"
	pvregistry "k8s.io/kubernetes/pkg/registry/core/persistentvolume"
	pvcregistry "k8s.io/kubernetes/pkg/registry/core/persistentvolumeclaim"
	storageclassregistry "k8s.io/kubernetes/pkg/registry/storage/storageclass"
)

// PersistentVolumes, PersistentVolumeClaims (core/v1) and StorageClasses (storage.k8s.io/v1) follow
// Kubernetes' own contract: kube's v1 defaults (reclaimPolicy Retain for a PV, Delete for a class,
// volumeBindingMode Immediate, volumeMode Filesystem), kube's registry strategies (status only through
// /status, a claim's spec immutable once bound but for its requests) and validation with field paths, run on
// kube's internal types through the converting adapter (kubestrategy.go). Kubernetes' PersistentVolume
// controller binds claims to volumes (controller/persistentvolume.go); the default class, local-path,
// provisions a directory on the node the scheduler picks for the claim's first pod (nodeagent/localpath.go).

func init() {
	// kube's internal core and storage types, the v1 ones, and kube's conversions and v1 defaults.
	utilruntime.Must(core.AddToScheme(kubeScheme))
	utilruntime.Must(kubecorev1.AddToScheme(kubeScheme))
	utilruntime.Must(storage.AddToScheme(kubeScheme))
	utilruntime.Must(kubestoragev1.AddToScheme(kubeScheme))
}

var (
	persistentVolumeStrategies = &kubeStrategies{
		internal:     func() runtime.Object { return &core.PersistentVolume{} },
		main:         pvregistry.Strategy,
		subresources: map[string]kubeStrategy{"status": pvregistry.StatusStrategy},
	}
	persistentVolumeClaimStrategies = &kubeStrategies{
		internal:     func() runtime.Object { return &core.PersistentVolumeClaim{} },
		main:         pvcregistry.Strategy,
		subresources: map[string]kubeStrategy{"status": pvcregistry.StatusStrategy},
	}
	storageClassStrategies = &kubeStrategies{
		internal: func() runtime.Object { return &storage.StorageClass{} },
		main:     storageclassregistry.Strategy,
	}
)

// accessModes abbreviates access modes as kubectl prints them (RWO,ROX).
func accessModes(modes []corev1.PersistentVolumeAccessMode) string {
	short := map[corev1.PersistentVolumeAccessMode]string{corev1.ReadWriteOnce: "RWO", corev1.ReadOnlyMany: "ROX",
		corev1.ReadWriteMany: "RWX", corev1.ReadWriteOncePod: "RWOP"}
	var out []string
	for _, m := range modes {
		if s, ok := short[m]; ok {
			out = append(out, s)
		}
	}
	return strings.Join(out, ",")
}

func storageQuantity(rl corev1.ResourceList) string {
	if q, ok := rl[corev1.ResourceStorage]; ok {
		return q.String()
	}
	return ""
}

// persistentVolumeColumns are `kubectl get pv`'s columns, as kube-apiserver prints them.
var persistentVolumeColumns = []column{
	nameColumn,
	{name: "Capacity", typ: "string", value: func(o runtime.Object) any {
		return storageQuantity(o.(*corev1.PersistentVolume).Spec.Capacity)
	}},
	{name: "Access Modes", typ: "string", value: func(o runtime.Object) any {
		return accessModes(o.(*corev1.PersistentVolume).Spec.AccessModes)
	}},
	{name: "Reclaim Policy", typ: "string", value: func(o runtime.Object) any {
		return string(o.(*corev1.PersistentVolume).Spec.PersistentVolumeReclaimPolicy)
	}},
	{name: "Status", typ: "string", value: func(o runtime.Object) any { return string(o.(*corev1.PersistentVolume).Status.Phase) }},
	{name: "Claim", typ: "string", value: func(o runtime.Object) any {
		if ref := o.(*corev1.PersistentVolume).Spec.ClaimRef; ref != nil {
			return ref.Namespace + "/" + ref.Name
		}
		return ""
	}},
	{name: "StorageClass", typ: "string", value: func(o runtime.Object) any { return o.(*corev1.PersistentVolume).Spec.StorageClassName }},
	{name: "Reason", typ: "string", value: func(o runtime.Object) any { return o.(*corev1.PersistentVolume).Status.Reason }},
	ageColumn,
	{name: "VolumeMode", typ: "string", priority: 1, value: func(o runtime.Object) any {
		if m := o.(*corev1.PersistentVolume).Spec.VolumeMode; m != nil {
			return string(*m)
		}
		return ""
	}},
}

// persistentVolumeClaimColumns are `kubectl get pvc`'s columns, as kube-apiserver prints them.
var persistentVolumeClaimColumns = []column{
	nameColumn,
	{name: "Status", typ: "string", value: func(o runtime.Object) any {
		c := o.(*corev1.PersistentVolumeClaim)
		if c.DeletionTimestamp != nil {
			return "Terminating"
		}
		return string(c.Status.Phase)
	}},
	{name: "Volume", typ: "string", value: func(o runtime.Object) any { return o.(*corev1.PersistentVolumeClaim).Spec.VolumeName }},
	{name: "Capacity", typ: "string", value: func(o runtime.Object) any {
		return storageQuantity(o.(*corev1.PersistentVolumeClaim).Status.Capacity)
	}},
	{name: "Access Modes", typ: "string", value: func(o runtime.Object) any {
		return accessModes(o.(*corev1.PersistentVolumeClaim).Status.AccessModes)
	}},
	{name: "StorageClass", typ: "string", value: func(o runtime.Object) any {
		if c := o.(*corev1.PersistentVolumeClaim).Spec.StorageClassName; c != nil {
			return *c
		}
		return ""
	}},
	ageColumn,
	{name: "VolumeMode", typ: "string", priority: 1, value: func(o runtime.Object) any {
		if m := o.(*corev1.PersistentVolumeClaim).Spec.VolumeMode; m != nil {
			return string(*m)
		}
		return ""
	}},
}

// storageClassColumns are `kubectl get sc`'s columns; the default class's name says "(default)".
var storageClassColumns = []column{
	{name: "Name", typ: "string", value: func(o runtime.Object) any {
		sc := o.(*storagev1.StorageClass)
		if isDefaultClass(sc) {
			return sc.Name + " (default)"
		}
		return sc.Name
	}},
	{name: "Provisioner", typ: "string", value: func(o runtime.Object) any { return o.(*storagev1.StorageClass).Provisioner }},
	{name: "ReclaimPolicy", typ: "string", value: func(o runtime.Object) any {
		if p := o.(*storagev1.StorageClass).ReclaimPolicy; p != nil {
			return string(*p)
		}
		return string(corev1.PersistentVolumeReclaimDelete)
	}},
	{name: "VolumeBindingMode", typ: "string", value: func(o runtime.Object) any {
		if m := o.(*storagev1.StorageClass).VolumeBindingMode; m != nil {
			return string(*m)
		}
		return string(storagev1.VolumeBindingImmediate)
	}},
	{name: "AllowVolumeExpansion", typ: "string", value: func(o runtime.Object) any {
		e := o.(*storagev1.StorageClass).AllowVolumeExpansion
		return fmt.Sprint(e != nil && *e)
	}},
	ageColumn,
}

// Annotations that mark the default StorageClass: the GA one and the beta one older manifests carry.
const (
	isDefaultClassAnnotation     = "storageclass.kubernetes.io/is-default-class"
	betaIsDefaultClassAnnotation = "storageclass.beta.kubernetes.io/is-default-class"
)

func isDefaultClass(sc *storagev1.StorageClass) bool {
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
		if !isDefaultClass(sc) {
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
