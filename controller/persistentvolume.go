package controller

import (
	"context"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/controller/volume/persistentvolume"
	"k8s.io/kubernetes/pkg/controller/volume/pvcprotection"
	"k8s.io/kubernetes/pkg/controller/volume/pvprotection"
)

// pvSyncPeriod is kube-controller-manager's default --pvclaimbinder-sync-period.
const pvSyncPeriod = 15 * time.Second

// buildPersistentVolumeBinder builds Kubernetes' own PersistentVolume controller, as kube-controller-manager
// runs it, with no in-tree volume plugins: it binds claims to matching volumes (Pending → Bound), asks the
// class's external provisioner for a volume (the claim's volume.kubernetes.io/storage-provisioner annotation),
// for a WaitForFirstConsumer class only once the scheduler chose the node (volume.kubernetes.io/selected-node),
// marks a volume whose claim is gone Released, and leaves a Released volume with reclaim policy Delete to
// its provisioner (the node agents, for local-path) and one with Retain to the operator.
func buildPersistentVolumeBinder(ctx context.Context, c *Clients) (func(), error) {
	f := c.Informers
	ctl, err := persistentvolume.NewController(ctx, persistentvolume.ControllerParameters{
		KubeClient:                c.Kube,
		SyncPeriod:                pvSyncPeriod,
		VolumeInformer:            f.Core().V1().PersistentVolumes(),
		ClaimInformer:             f.Core().V1().PersistentVolumeClaims(),
		ClassInformer:             f.Storage().V1().StorageClasses(),
		PodInformer:               f.Core().V1().Pods(),
		NodeInformer:              f.Core().V1().Nodes(),
		EnableDynamicProvisioning: true,
	})
	if err != nil {
		return nil, err
	}
	return func() { ctl.Run(ctx) }, nil
}

// buildPVCProtection builds Kubernetes' pvc-protection controller: it removes the kubernetes.io/pvc-protection
// finalizer (which admission adds to every claim) once no pod that is not finished uses the claim, so a
// claim deleted while a pod mounts it waits for that pod.
func buildPVCProtection(ctx context.Context, c *Clients) (func(), error) {
	f := c.Informers
	ctl, err := pvcprotection.NewPVCProtectionController(klog.FromContext(ctx), f.Core().V1().PersistentVolumeClaims(), f.Core().V1().Pods(), c.Kube)
	if err != nil {
		return nil, err
	}
	return func() { ctl.Run(ctx, 1) }, nil
}

// buildPVProtection builds Kubernetes' pv-protection controller: it removes the kubernetes.io/pv-protection
// finalizer once the volume is bound to no claim.
func buildPVProtection(ctx context.Context, c *Clients) (func(), error) {
	f := c.Informers
	ctl, err := pvprotection.NewPVProtectionController(klog.FromContext(ctx), f.Core().V1().PersistentVolumes(), c.Kube)
	if err != nil {
		return nil, err
	}
	return func() { ctl.Run(ctx, 1) }, nil
}
