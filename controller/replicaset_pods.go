package controller

import (
	"math"
	"sort"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Pod readiness, and the order in which a ReplicaSet gives up its pods on scale-down.

// podsToDelete picks n of the active pods to delete, the least valuable first (see deleteFirst).
func podsToDelete(active, related []*corev1.Pod, n int, now time.Time) []*corev1.Pod {
	if n >= len(active) {
		return active
	}
	ranked := rankForDeletion(active, related, now)
	return ranked[:n]
}

// rankForDeletion returns the pods sorted so that the ones to delete first come first. related are the
// pods counted when looking for nodes that run more than one of the owner's pods.
func rankForDeletion(pods, related []*corev1.Pod, now time.Time) []*corev1.Pod {
	onNode := map[string]int{}
	for _, pod := range related {
		if isPodActive(pod) {
			onNode[pod.Spec.NodeName]++
		}
	}
	ranked := make([]rankedPod, len(pods))
	for i, pod := range pods {
		ranked[i] = rankedPod{pod: pod, podsOnNode: onNode[pod.Spec.NodeName]}
	}
	sort.SliceStable(ranked, func(i, j int) bool { return deleteFirst(ranked[i], ranked[j], now) })
	out := make([]*corev1.Pod, len(ranked))
	for i := range ranked {
		out[i] = ranked[i].pod
	}
	return out
}

type rankedPod struct {
	pod        *corev1.Pod
	podsOnNode int // related active pods on the same node
}

// phaseOrder ranks the phases of active pods: the earlier a pod is in its life, the less is lost deleting it.
var phaseOrder = map[corev1.PodPhase]int{corev1.PodPending: 0, corev1.PodUnknown: 1, corev1.PodRunning: 2}

// deleteFirst reports whether a should be deleted before b. The criteria are Kubernetes', in order:
//  1. not scheduled before scheduled;
//  2. Pending before Unknown before Running;
//  3. not ready before ready;
//  4. lower pod-deletion-cost annotation before higher;
//  5. on a node with more of the owner's pods before fewer (spreads what remains);
//  6. ready for less time before more (on a logarithmic scale);
//  7. more container restarts before fewer (regular containers, then sidecars);
//  8. created more recently before longer ago (on a logarithmic scale).
//
// The logarithmic scale (by the power of two of the age) makes pods of similar age equal, and breaks the
// tie by UID, which is random, so repeated scale-downs do not always spare the same pods.
func deleteFirst(a, b rankedPod, now time.Time) bool {
	pa, pb := a.pod, b.pod
	if (pa.Spec.NodeName == "") != (pb.Spec.NodeName == "") {
		return pa.Spec.NodeName == ""
	}
	if phaseOrder[pa.Status.Phase] != phaseOrder[pb.Status.Phase] {
		return phaseOrder[pa.Status.Phase] < phaseOrder[pb.Status.Phase]
	}
	readyA, readyB := isPodReady(pa), isPodReady(pb)
	if readyA != readyB {
		return !readyA
	}
	if costA, costB := deletionCost(pa), deletionCost(pb); costA != costB {
		return costA < costB
	}
	if a.podsOnNode != b.podsOnNode {
		return a.podsOnNode > b.podsOnNode
	}
	if readyA && readyB {
		sinceA, sinceB := readySince(pa), readySince(pb)
		if !sinceA.Equal(sinceB) {
			return newerOnLogScale(sinceA, sinceB, pa.UID, pb.UID, now)
		}
	}
	if restartsA, restartsB := maxRestarts(pa), maxRestarts(pb); restartsA != restartsB {
		return restartsA.regular > restartsB.regular ||
			(restartsA.regular == restartsB.regular && restartsA.sidecar > restartsB.sidecar)
	}
	if !pa.CreationTimestamp.Equal(&pb.CreationTimestamp) {
		return newerOnLogScale(pa.CreationTimestamp.Time, pb.CreationTimestamp.Time, pa.UID, pb.UID, now)
	}
	return false
}

// newerOnLogScale reports whether time a is later than b when ages are compared by their power of two; a
// zero time counts as the newest. Equal buckets fall back to the UIDs.
func newerOnLogScale(a, b time.Time, uidA, uidB types.UID, now time.Time) bool {
	if a.IsZero() || b.IsZero() || now.IsZero() {
		if a.IsZero() || b.IsZero() {
			return a.IsZero()
		}
		return a.After(b)
	}
	if diff := ageBucket(now.Sub(a)) - ageBucket(now.Sub(b)); diff != 0 {
		return diff < 0
	}
	return uidA < uidB
}

func ageBucket(age time.Duration) int64 {
	if age <= 0 {
		return -1
	}
	return int64(math.Log2(float64(age)))
}

// deletionCost reads the pod-deletion-cost annotation; a missing or malformed one counts as 0.
func deletionCost(pod *corev1.Pod) int32 {
	v, ok := pod.Annotations[podDeletionCostAnnotation]
	if !ok {
		return 0
	}
	cost, err := strconv.ParseInt(v, 10, 32)
	if err != nil {
		return 0
	}
	return int32(cost)
}

type restarts struct{ regular, sidecar int32 }

// maxRestarts is the highest restart count among the pod's containers, and among its sidecars (init
// containers that restart always).
func maxRestarts(pod *corev1.Pod) restarts {
	var out restarts
	for _, cs := range pod.Status.ContainerStatuses {
		out.regular = max(out.regular, cs.RestartCount)
	}
	sidecars := map[string]bool{}
	for _, c := range pod.Spec.InitContainers {
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			sidecars[c.Name] = true
		}
	}
	for _, cs := range pod.Status.InitContainerStatuses {
		if sidecars[cs.Name] {
			out.sidecar = max(out.sidecar, cs.RestartCount)
		}
	}
	return out
}

func podReadyCondition(pod *corev1.Pod) *corev1.PodCondition {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == corev1.PodReady {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}

func isPodReady(pod *corev1.Pod) bool {
	c := podReadyCondition(pod)
	return c != nil && c.Status == corev1.ConditionTrue
}

// readySince is when a ready pod became ready (zero when unknown).
func readySince(pod *corev1.Pod) time.Time {
	if c := podReadyCondition(pod); c != nil && c.Status == corev1.ConditionTrue {
		return c.LastTransitionTime.Time
	}
	return time.Time{}
}

// isPodAvailable: ready, and for longer than minReadySeconds.
func isPodAvailable(pod *corev1.Pod, minReadySeconds int32, now time.Time) bool {
	if !isPodReady(pod) {
		return false
	}
	if minReadySeconds == 0 {
		return true
	}
	since := readySince(pod)
	return !since.IsZero() && since.Add(time.Duration(minReadySeconds)*time.Second).Before(now)
}
