package scheduler

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
)

// The claim annotation through which the scheduler tells a WaitForFirstConsumer class's provisioner which
// node the claim's first pod will run on (Kubernetes' volume.kubernetes.io/selected-node).
const SelectedNodeAnnotation = "volume.kubernetes.io/selected-node"

// Reasons a node fails volumeBinding, in Kubernetes' words.
const (
	volumeNodeAffinityConflict = "node(s) had volume node affinity conflict"
	unboundImmediateClaims     = "pod has unbound immediate PersistentVolumeClaims"
)

// ClaimSource reads the claims, volumes and classes the volume binding plugin needs (the scheduler's
// informers).
type ClaimSource interface {
	Claim(namespace, name string) (*corev1.PersistentVolumeClaim, error)
	Volume(name string) (*corev1.PersistentVolume, error)
	Class(name string) (*storagev1.StorageClass, error)
}

// podClaims is what volumeBinding's PreFilter learned of a pod's claims: the node affinity each bound
// volume requires, and the claims that wait for this pod's node (WaitForFirstConsumer).
type podClaims struct {
	affinities []nodeaffinity.RequiredNodeAffinity
	delayed    []*corev1.PersistentVolumeClaim
}

const volumeBindingStateKey = "VolumeBinding"

// volumeBinding is Kubernetes' VolumeBinding plugin for the volumes Skiff serves: a pod whose claim is bound
// to a volume with node affinity (a local volume) goes only where the volume is; a claim of a
// WaitForFirstConsumer class that is not yet bound fits any node, and the scheduler names the chosen node on
// the claim before it binds the pod (see annotateSelectedNode), so the class's provisioner makes the volume
// there; a claim that is missing, being deleted, or unbound with Immediate binding makes the pod wait.
type volumeBinding struct{}

func (volumeBinding) Name() string { return "VolumeBinding" }

func (volumeBinding) PreFilter(_ context.Context, state *CycleState, pod *corev1.Pod, _ []*NodeInfo) *Status {
	if !hasClaims(pod) {
		return nil
	}
	if state.Claims == nil {
		return NewStatus(UnschedulableAndUnresolvable, "persistent volume claims cannot be read")
	}
	pc, st := readPodClaims(state.Claims, pod)
	if st != nil {
		return st
	}
	state.Write(volumeBindingStateKey, pc)
	return nil
}

func (volumeBinding) Filter(_ context.Context, state *CycleState, _ *corev1.Pod, n *NodeInfo) *Status {
	pc, _ := state.Read(volumeBindingStateKey).(*podClaims)
	if pc == nil {
		return nil
	}
	for _, a := range pc.affinities {
		if ok, _ := a.Match(n.Node); !ok {
			return NewStatus(UnschedulableAndUnresolvable, volumeNodeAffinityConflict)
		}
	}
	return nil
}

func hasClaims(pod *corev1.Pod) bool {
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			return true
		}
	}
	return false
}

// readPodClaims looks up each claim of the pod, its volume when bound, and its class when not.
func readPodClaims(src ClaimSource, pod *corev1.Pod) (*podClaims, *Status) {
	pc := &podClaims{}
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim == nil {
			continue
		}
		name := v.PersistentVolumeClaim.ClaimName
		claim, err := src.Claim(pod.Namespace, name)
		switch {
		case apierrors.IsNotFound(err):
			return nil, NewStatus(UnschedulableAndUnresolvable, fmt.Sprintf("persistentvolumeclaim %q not found", name))
		case err != nil:
			return nil, NewStatus(Error, err.Error())
		case claim.DeletionTimestamp != nil:
			return nil, NewStatus(UnschedulableAndUnresolvable, fmt.Sprintf("persistentvolumeclaim %q is being deleted", name))
		}
		if claim.Spec.VolumeName != "" {
			pv, err := src.Volume(claim.Spec.VolumeName)
			if err != nil {
				return nil, NewStatus(UnschedulableAndUnresolvable, fmt.Sprintf("persistentvolume %q of claim %q: %v", claim.Spec.VolumeName, name, err))
			}
			if na := pv.Spec.NodeAffinity; na != nil && na.Required != nil {
				pc.affinities = append(pc.affinities, nodeaffinity.GetRequiredNodeAffinity(&corev1.Pod{Spec: corev1.PodSpec{
					Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: na.Required}}}}))
			}
			continue
		}
		if class := claim.Spec.StorageClassName; class != nil && *class != "" {
			sc, err := src.Class(*class)
			if err == nil && sc.VolumeBindingMode != nil && *sc.VolumeBindingMode == storagev1.VolumeBindingWaitForFirstConsumer {
				pc.delayed = append(pc.delayed, claim)
				continue
			}
		}
		return nil, NewStatus(UnschedulableAndUnresolvable, unboundImmediateClaims)
	}
	return pc, nil
}

// informerClaims is a ClaimSource over the scheduler's informers.
type informerClaims struct {
	claims  corelisters.PersistentVolumeClaimLister
	volumes corelisters.PersistentVolumeLister
	classes storagelisters.StorageClassLister
}

func (i informerClaims) Claim(namespace, name string) (*corev1.PersistentVolumeClaim, error) {
	return i.claims.PersistentVolumeClaims(namespace).Get(name)
}
func (i informerClaims) Volume(name string) (*corev1.PersistentVolume, error) {
	return i.volumes.Get(name)
}
func (i informerClaims) Class(name string) (*storagev1.StorageClass, error) {
	return i.classes.Get(name)
}

// annotateSelectedNode names the chosen node on each of the pod's claims that waits for its first consumer,
// before the pod is bound, as kube-scheduler's VolumeBinding PreBind does; the class's provisioner then
// makes the volume on that node, and the node's agent starts the pod once the claim is bound. The patch is
// conditional on the claim's resourceVersion, so a claim bound meanwhile is not re-annotated.
func (s *Scheduler) annotateSelectedNode(ctx context.Context, pod *corev1.Pod, host string) error {
	if s.claims == nil || !hasClaims(pod) {
		return nil
	}
	pc, st := readPodClaims(s.claims, pod)
	if st != nil {
		return fmt.Errorf("%s", st)
	}
	for _, claim := range pc.delayed {
		if claim.Annotations[SelectedNodeAnnotation] == host {
			continue
		}
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
			"resourceVersion": claim.ResourceVersion,
			"annotations":     map[string]string{SelectedNodeAnnotation: host},
		}})
		if _, err := s.client.CoreV1().PersistentVolumeClaims(claim.Namespace).Patch(ctx, claim.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("claim %s: %w", claim.Name, err)
		}
	}
	return nil
}
