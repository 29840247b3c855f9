package apiserver

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/kubernetes/pkg/apis/core"
	kubecorev1 "k8s.io/kubernetes/pkg/apis/core/v1"
	"k8s.io/kubernetes/pkg/apis/storage"
	kubestoragev1 "k8s.io/kubernetes/pkg/apis/storage/v1"
	pvregistry "k8s.io/kubernetes/pkg/registry/core/persistentvolume"
	pvcregistry "k8s.io/kubernetes/pkg/registry/core/persistentvolumeclaim"
	csidriverregistry "k8s.io/kubernetes/pkg/registry/storage/csidriver"
	csinoderegistry "k8s.io/kubernetes/pkg/registry/storage/csinode"
	csistoragecapacityregistry "k8s.io/kubernetes/pkg/registry/storage/csistoragecapacity"
	storageclassregistry "k8s.io/kubernetes/pkg/registry/storage/storageclass"
	volumeattachmentregistry "k8s.io/kubernetes/pkg/registry/storage/volumeattachment"
	volumeattributesclassregistry "k8s.io/kubernetes/pkg/registry/storage/volumeattributesclass"

	skiffadmission "github.com/skiff-dev/skiff/apiserver/admission"
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
	// The objects of CSI drivers: Skiff's agent mounts no CSI volumes, but drivers installed on the cluster
	// and their tools read and write these as on any cluster.
	csiDriverStrategies = &kubeStrategies{
		internal: func() runtime.Object { return &storage.CSIDriver{} },
		main:     csidriverregistry.Strategy,
	}
	csiNodeStrategies = &kubeStrategies{
		internal: func() runtime.Object { return &storage.CSINode{} },
		main:     csinoderegistry.Strategy,
	}
	csiStorageCapacityStrategies = &kubeStrategies{
		internal: func() runtime.Object { return &storage.CSIStorageCapacity{} },
		main:     csistoragecapacityregistry.Strategy,
	}
	volumeAttachmentStrategies = &kubeStrategies{
		internal:     func() runtime.Object { return &storage.VolumeAttachment{} },
		main:         volumeattachmentregistry.Strategy,
		subresources: map[string]kubeStrategy{"status": volumeattachmentregistry.StatusStrategy},
	}
	volumeAttributesClassStrategies = &kubeStrategies{
		internal: func() runtime.Object { return &storage.VolumeAttributesClass{} },
		main:     volumeattributesclassregistry.Strategy,
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
		if skiffadmission.IsDefaultStorageClass(sc) {
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
