package scheduler

import (
	"context"
	"math"
	"sort"

	corev1 "k8s.io/api/core/v1"
)

// nodeResourcesFit rejects nodes without room for the pod's requests (cpu, memory, ephemeral-storage,
// extended resources) or its pod slot, counting the pods bound or assumed there. As a score it prefers the
// least allocated nodes (LeastAllocated).
type nodeResourcesFit struct{}

func (nodeResourcesFit) Name() string { return "NodeResourcesFit" }

func (nodeResourcesFit) Filter(_ context.Context, state *CycleState, _ *corev1.Pod, n *NodeInfo) *Status {
	var reasons []string
	if int64(len(n.Pods))+1 > n.Allocatable.AllowedPods {
		reasons = append(reasons, "Too many pods")
	}
	req, alloc, used := state.PodInfo.Requests, n.Allocatable, n.Requested
	checks := []struct {
		want, free int64
		reason     string
	}{
		{req.MilliCPU, alloc.MilliCPU - used.MilliCPU, "Insufficient cpu"},
		{req.Memory, alloc.Memory - used.Memory, "Insufficient memory"},
		{req.EphemeralStorage, alloc.EphemeralStorage - used.EphemeralStorage, "Insufficient ephemeral-storage"},
	}
	for _, c := range checks {
		if c.want > 0 && c.want > c.free {
			reasons = append(reasons, c.reason)
		}
	}
	names := make([]string, 0, len(req.Scalar))
	for name := range req.Scalar {
		names = append(names, string(name))
	}
	sort.Strings(names) // reasons in a stable order
	for _, name := range names {
		rn := corev1.ResourceName(name)
		if want := req.Scalar[rn]; want > 0 && want > alloc.Scalar[rn]-used.Scalar[rn] {
			reasons = append(reasons, "Insufficient "+name)
		}
	}
	if len(reasons) > 0 {
		return NewStatus(Unschedulable, reasons...)
	}
	return nil
}

// Score is LeastAllocated: the mean over cpu and memory of the share left free once the pod is placed.
// Requests a container leaves unset count as 100m cpu and 200Mi memory, so that such pods still spread.
func (nodeResourcesFit) Score(_ context.Context, state *CycleState, _ *corev1.Pod, n *NodeInfo) (int64, *Status) {
	cpu := leastAllocated(n.NonZeroRequested.MilliCPU+state.PodInfo.NonZeroRequests.MilliCPU, n.Allocatable.MilliCPU)
	mem := leastAllocated(n.NonZeroRequested.Memory+state.PodInfo.NonZeroRequests.Memory, n.Allocatable.Memory)
	return (cpu + mem) / 2, nil
}

func leastAllocated(requested, capacity int64) int64 {
	if capacity == 0 || requested > capacity {
		return 0
	}
	return (capacity - requested) * MaxNodeScore / capacity
}

// balancedAllocation prefers nodes whose cpu and memory would be used in equal shares once the pod is
// placed: 100 times one minus the standard deviation of the two shares.
type balancedAllocation struct{}

func (balancedAllocation) Name() string { return "NodeResourcesBalancedAllocation" }

func (balancedAllocation) Score(_ context.Context, state *CycleState, _ *corev1.Pod, n *NodeInfo) (int64, *Status) {
	share := func(requested, capacity int64) float64 {
		if capacity == 0 {
			return 1
		}
		return math.Min(1, float64(requested)/float64(capacity))
	}
	cpu := share(n.NonZeroRequested.MilliCPU+state.PodInfo.NonZeroRequests.MilliCPU, n.Allocatable.MilliCPU)
	mem := share(n.NonZeroRequested.Memory+state.PodInfo.NonZeroRequests.Memory, n.Allocatable.Memory)
	std := math.Abs(cpu-mem) / 2 // the standard deviation of two values
	return int64((1 - std) * float64(MaxNodeScore)), nil
}

// imageLocality prefers nodes that already hold the pod's images (from the node status `images` list),
// weighing each image by its size and by how many nodes share it, so that a ubiquitous image does not pull
// every pod to the same few nodes.
type imageLocality struct{}

func (imageLocality) Name() string { return "ImageLocality" }

const (
	imageMinThreshold          = 23 * 1024 * 1024   // below this, an image is cheap to pull anyway
	imageMaxContainerThreshold = 1000 * 1024 * 1024 // above this per container, the score saturates
)

func (imageLocality) Score(_ context.Context, state *CycleState, _ *corev1.Pod, n *NodeInfo) (int64, *Status) {
	if state.NodeCount == 0 {
		return 0, nil
	}
	var sum int64
	for _, name := range state.PodInfo.Images {
		if size, ok := n.images[name]; ok {
			sum += int64(float64(size) * float64(state.ImageNodes[name]) / float64(state.NodeCount))
		}
	}
	maxThreshold := int64(imageMaxContainerThreshold * len(state.PodInfo.Images))
	switch {
	case sum < imageMinThreshold:
		return 0, nil
	case sum > maxThreshold:
		return MaxNodeScore, nil
	}
	return MaxNodeScore * (sum - imageMinThreshold) / (maxThreshold - imageMinThreshold), nil
}
