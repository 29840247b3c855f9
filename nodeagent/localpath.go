package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// LocalPathProvisioner is the provisioner of Skiff's default StorageClass, local-path: every node agent
// provisions, on its own nodes, the claims the scheduler placed there.
const LocalPathProvisioner = "skiff.dev/local-path"

// Annotations of Kubernetes' external provisioning protocol, which the PersistentVolume controller speaks.
const (
	annStorageProvisioner     = "volume.kubernetes.io/storage-provisioner"
	annBetaStorageProvisioner = "volume.beta.kubernetes.io/storage-provisioner"
	annSelectedNode           = "volume.kubernetes.io/selected-node"
	annProvisionedBy          = "pv.kubernetes.io/provisioned-by"
)

// volumesDir holds the local-path volumes of an agent's nodes: <data_dir>/volumes/<pv>.
func (a *Agent) volumesDir() string { return filepath.Join(a.cfg.DataDir, "volumes") }

// runLocalPath is the local-path provisioner of this agent's nodes, an external provisioner as Kubernetes
// defines them (k3s ships the same class):
//   - a claim of the class, with the PersistentVolume controller's storage-provisioner annotation, that the
//     scheduler placed on one of this agent's nodes (selected-node) gets a directory
//     <data_dir>/volumes/pvc-<claim uid> and a PersistentVolume of that path, pinned to the node by node
//     affinity and pre-bound to the claim, which the controller then binds;
//   - a volume it provisioned that was Released with reclaim policy Delete loses its directory, then the
//     volume is deleted. With Retain, the data stays until the operator deletes the volume and directory.
//
// Work is retried with backoff; a claim or volume seen again after a restart is handled the same way, so
// nothing is lost if the agent stops halfway.
func (a *Agent) runLocalPath(ctx context.Context) {
	factory := informers.NewSharedInformerFactory(a.client, 10*time.Minute)
	claims := factory.Core().V1().PersistentVolumeClaims()
	volumes := factory.Core().V1().PersistentVolumes()
	queue := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	defer queue.ShutDown()
	enqueue := func(prefix string) func(obj any) {
		return func(obj any) {
			if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
				queue.Add(prefix + key)
			}
		}
	}
	handler := func(prefix string) cache.ResourceEventHandlerFuncs {
		return cache.ResourceEventHandlerFuncs{AddFunc: enqueue(prefix), UpdateFunc: func(_, obj any) { enqueue(prefix)(obj) }}
	}
	if _, err := claims.Informer().AddEventHandler(handler("claim/")); err != nil {
		a.logger.Error("local-path provisioner not started", "error", err)
		return
	}
	if _, err := volumes.Informer().AddEventHandler(handler("volume/")); err != nil {
		a.logger.Error("local-path provisioner not started", "error", err)
		return
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), claims.Informer().HasSynced, volumes.Informer().HasSynced) {
		return
	}
	go func() { <-ctx.Done(); queue.ShutDown() }()
	for {
		key, quit := queue.Get()
		if quit {
			return
		}
		var err error
		if name, ok := strings.CutPrefix(key, "claim/"); ok {
			err = a.provision(ctx, claims.Informer().GetIndexer(), volumes.Lister(), name)
		} else if name, ok := strings.CutPrefix(key, "volume/"); ok {
			err = a.reclaim(ctx, volumes.Lister(), name)
		}
		if err != nil && ctx.Err() == nil {
			a.logger.Warn("local-path volume", "object", key, "error", err)
			queue.AddRateLimited(key)
		} else {
			queue.Forget(key)
		}
		queue.Done(key)
	}
}

// provision makes the volume of a claim placed on one of this agent's nodes, if it still needs one.
func (a *Agent) provision(ctx context.Context, claims cache.Indexer, volumes corelisters.PersistentVolumeLister, key string) error {
	obj, exists, err := claims.GetByKey(key)
	if err != nil || !exists {
		return err
	}
	claim := obj.(*corev1.PersistentVolumeClaim)
	node := claim.Annotations[annSelectedNode]
	provisioner := claim.Annotations[annStorageProvisioner]
	if provisioner == "" {
		provisioner = claim.Annotations[annBetaStorageProvisioner]
	}
	if provisioner != LocalPathProvisioner || !a.nodes[node] || claim.Spec.VolumeName != "" || claim.DeletionTimestamp != nil {
		return nil
	}
	name := "pvc-" + string(claim.UID)
	if _, err := volumes.Get(name); err == nil {
		return nil // made already; the controller binds it
	}
	if err := localPathModes(claim.Spec.AccessModes); err != nil {
		a.recorder.Eventf(claim, corev1.EventTypeWarning, "ProvisioningFailed", "%s: %v", LocalPathProvisioner, err)
		return nil // the claim must change; its update comes back here
	}
	if claim.Spec.VolumeMode != nil && *claim.Spec.VolumeMode == corev1.PersistentVolumeBlock {
		a.recorder.Eventf(claim, corev1.EventTypeWarning, "ProvisioningFailed", "%s: block volumes are not supported", LocalPathProvisioner)
		return nil
	}
	reclaim := corev1.PersistentVolumeReclaimDelete
	if class := claim.Spec.StorageClassName; class != nil {
		sc, err := a.client.StorageV1().StorageClasses().Get(ctx, *class, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("class of claim: %w", err)
		}
		if sc.ReclaimPolicy != nil {
			reclaim = *sc.ReclaimPolicy
		}
		if err := localPathParameters(sc); err != nil {
			a.recorder.Eventf(claim, corev1.EventTypeWarning, "ProvisioningFailed", "%s: %v", LocalPathProvisioner, err)
			return nil
		}
	}
	dir := filepath.Join(a.volumesDir(), name)
	// World-writable, as k3s's local-path makes them: the pod's user is not known here.
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		return err
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{annProvisionedBy: LocalPathProvisioner}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: claim.Spec.Resources.Requests[corev1.ResourceStorage]},
			AccessModes:                   claim.Spec.AccessModes,
			PersistentVolumeReclaimPolicy: reclaim,
			StorageClassName:              ptrValue(claim.Spec.StorageClassName),
			VolumeMode:                    claim.Spec.VolumeMode,
			ClaimRef: &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1", Namespace: claim.Namespace,
				Name: claim.Name, UID: claim.UID, ResourceVersion: claim.ResourceVersion},
			PersistentVolumeSource: corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: dir}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
			}}}},
		},
	}
	if _, err := a.client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	a.recorder.Eventf(claim, corev1.EventTypeNormal, "ProvisioningSucceeded", "Successfully provisioned volume %s on node %s", name, node)
	return nil
}

// reclaim removes the directory of a volume this agent provisioned once it is Released with reclaim policy
// Delete, then the volume.
func (a *Agent) reclaim(ctx context.Context, volumes corelisters.PersistentVolumeLister, name string) error {
	pv, err := volumes.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	if pv.Annotations[annProvisionedBy] != LocalPathProvisioner || pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete ||
		pv.Status.Phase != corev1.VolumeReleased || pv.Spec.Local == nil || !a.ownsVolume(pv) {
		return nil
	}
	dir := pv.Spec.Local.Path
	if filepath.Dir(dir) != a.volumesDir() || filepath.Base(dir) != pv.Name {
		return fmt.Errorf("volume %s: path %s is not one this agent provisions; left alone", pv.Name, dir)
	}
	if err := os.RemoveAll(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	uid := pv.UID
	err = a.client.CoreV1().PersistentVolumes().Delete(ctx, pv.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	a.logger.Info("deleted a released local-path volume", "volume", pv.Name)
	return nil
}

// ownsVolume says whether the volume is pinned to one of this agent's nodes.
func (a *Agent) ownsVolume(pv *corev1.PersistentVolume) bool {
	for node := range a.nodes {
		if volumePinnedTo(pv, node) {
			return true
		}
	}
	return false
}

func volumePinnedTo(pv *corev1.PersistentVolume, node string) bool {
	na := pv.Spec.NodeAffinity
	if na == nil || na.Required == nil || len(na.Required.NodeSelectorTerms) != 1 {
		return false
	}
	exprs := na.Required.NodeSelectorTerms[0].MatchExpressions
	return len(exprs) == 1 && exprs[0].Key == corev1.LabelHostname && exprs[0].Operator == corev1.NodeSelectorOpIn &&
		len(exprs[0].Values) == 1 && exprs[0].Values[0] == node
}

// localPathModes refuses access modes a directory on one node cannot give: many nodes at once.
func localPathModes(modes []corev1.PersistentVolumeAccessMode) error {
	for _, m := range modes {
		switch m {
		case corev1.ReadWriteOnce, corev1.ReadWriteOncePod:
		default:
			return fmt.Errorf("access mode %s is not supported: a local-path volume lives on one node (use ReadWriteOnce or ReadWriteOncePod)", m)
		}
	}
	return nil
}

// localPathParameters refuses class parameters: local-path takes none, and an ignored one would mislead.
func localPathParameters(sc *storagev1.StorageClass) error {
	for k := range sc.Parameters {
		return fmt.Errorf("StorageClass %s: parameter %q is not supported by %s", sc.Name, k, LocalPathProvisioner)
	}
	return nil
}

func ptrValue(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
