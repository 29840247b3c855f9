package scheduler

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"
)

// The node plugins judge a node by its own spec and labels.

// nodeUnschedulable rejects cordoned nodes unless the pod tolerates the unschedulable taint.
type nodeUnschedulable struct{}

func (nodeUnschedulable) Name() string { return "NodeUnschedulable" }

func (nodeUnschedulable) Filter(_ context.Context, _ *CycleState, pod *corev1.Pod, n *NodeInfo) *Status {
	if !n.Node.Spec.Unschedulable {
		return nil
	}
	taint := corev1.Taint{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule}
	if tolerates(pod.Spec.Tolerations, &taint) {
		return nil
	}
	return NewStatus(UnschedulableAndUnresolvable, "node(s) were unschedulable")
}

// nodeName rejects every node but the one a pod names in spec.nodeName.
type nodeName struct{}

func (nodeName) Name() string { return "NodeName" }

func (nodeName) Filter(_ context.Context, _ *CycleState, pod *corev1.Pod, n *NodeInfo) *Status {
	if pod.Spec.NodeName != "" && pod.Spec.NodeName != n.Node.Name {
		return NewStatus(UnschedulableAndUnresolvable, "node(s) didn't match the requested node name")
	}
	return nil
}

// taintToleration rejects nodes with NoSchedule or NoExecute taints the pod does not tolerate, and prefers
// nodes with fewer untolerated PreferNoSchedule taints.
type taintToleration struct{}

func (taintToleration) Name() string { return "TaintToleration" }

// untoleratedTaint returns a NoSchedule or NoExecute taint of the node that the pod does not tolerate.
func untoleratedTaint(pod *corev1.Pod, n *NodeInfo) (corev1.Taint, bool) {
	return corev1helpers.FindMatchingUntoleratedTaint(klog.Background(), n.Node.Spec.Taints, pod.Spec.Tolerations,
		func(t *corev1.Taint) bool {
			return t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute
		}, false)
}

func (taintToleration) Filter(_ context.Context, _ *CycleState, pod *corev1.Pod, n *NodeInfo) *Status {
	taint, untolerated := untoleratedTaint(pod, n)
	if !untolerated {
		return nil
	}
	return NewStatus(UnschedulableAndUnresolvable, fmt.Sprintf("node(s) had untolerated taint {%s: %s}", taint.Key, taint.Value))
}

func (taintToleration) Score(_ context.Context, _ *CycleState, pod *corev1.Pod, n *NodeInfo) (int64, *Status) {
	var preferNoSchedule []corev1.Toleration
	for _, t := range pod.Spec.Tolerations {
		if t.Effect == "" || t.Effect == corev1.TaintEffectPreferNoSchedule {
			preferNoSchedule = append(preferNoSchedule, t)
		}
	}
	var count int64
	for i := range n.Node.Spec.Taints {
		taint := &n.Node.Spec.Taints[i]
		if taint.Effect == corev1.TaintEffectPreferNoSchedule && !tolerates(preferNoSchedule, taint) {
			count++
		}
	}
	return count, nil
}

// NormalizeScore gives the node with the most untolerated PreferNoSchedule taints 0.
func (taintToleration) NormalizeScore(_ context.Context, _ *CycleState, _ *corev1.Pod, scores []NodeScore) *Status {
	defaultNormalize(scores, true)
	return nil
}

func tolerates(tolerations []corev1.Toleration, taint *corev1.Taint) bool {
	// Gt and Lt tolerations are an alpha feature of Kubernetes; like its default, Skiff compares with
	// Equal and Exists only.
	return corev1helpers.TolerationsTolerateTaint(klog.Background(), tolerations, taint, false)
}

// nodeAffinity applies spec.nodeSelector and required node affinity (terms ORed, expressions ANDed,
// matchFields on metadata.name) as a filter, and preferred node affinity as a score.
type nodeAffinity struct{}

func (nodeAffinity) Name() string { return "NodeAffinity" }

type nodeAffinityState struct {
	required  nodeaffinity.RequiredNodeAffinity
	preferred *nodeaffinity.PreferredSchedulingTerms
}

func (p nodeAffinity) PreFilter(_ context.Context, state *CycleState, pod *corev1.Pod, _ []*NodeInfo) *Status {
	s := &nodeAffinityState{required: nodeaffinity.GetRequiredNodeAffinity(pod)}
	if a := pod.Spec.Affinity; a != nil && a.NodeAffinity != nil && len(a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution) > 0 {
		terms, err := nodeaffinity.NewPreferredSchedulingTerms(a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution)
		if err != nil {
			return NewStatus(UnschedulableAndUnresolvable, fmt.Sprintf("invalid preferred node affinity: %v", err))
		}
		s.preferred = terms
	}
	state.Write(p.Name(), s)
	return nil
}

func (p nodeAffinity) Filter(_ context.Context, state *CycleState, _ *corev1.Pod, n *NodeInfo) *Status {
	s := state.Read(p.Name()).(*nodeAffinityState)
	if ok, err := s.required.Match(n.Node); !ok || err != nil {
		return NewStatus(UnschedulableAndUnresolvable, nodeAffinityMismatch)
	}
	return nil
}

const nodeAffinityMismatch = "node(s) didn't match Pod's node affinity/selector"

// pinnedNodeNames returns the only nodes a pod's required node affinity admits when every term names them
// with matchFields metadata.name In (as the DaemonSet controller pins its pods), or nil when the affinity
// admits nodes by anything else. The scheduler filters such a pod on those nodes alone, as Kubernetes'
// NodeAffinity PreFilter narrows the node list: the filters still run on them.
func pinnedNodeNames(pod *corev1.Pod) []string {
	a := pod.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return nil
	}
	union := sets.New[string]()
	for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		var names sets.Set[string] // requirements of a term are ANDed
		for _, r := range term.MatchFields {
			if r.Key == metav1.ObjectNameField && r.Operator == corev1.NodeSelectorOpIn {
				if names == nil {
					names = sets.New(r.Values...)
				} else {
					names = names.Intersection(sets.New(r.Values...))
				}
			}
		}
		if names == nil {
			return nil // terms are ORed: this one may admit any node
		}
		union = union.Union(names)
	}
	return sets.List(union)
}

func (p nodeAffinity) Score(_ context.Context, state *CycleState, _ *corev1.Pod, n *NodeInfo) (int64, *Status) {
	s := state.Read(p.Name()).(*nodeAffinityState)
	if s.preferred == nil {
		return 0, nil
	}
	return s.preferred.Score(n.Node), nil
}

func (nodeAffinity) NormalizeScore(_ context.Context, _ *CycleState, _ *corev1.Pod, scores []NodeScore) *Status {
	defaultNormalize(scores, false)
	return nil
}

// nodePorts rejects nodes where a requested hostPort is taken.
type nodePorts struct{}

func (nodePorts) Name() string { return "NodePorts" }

func (nodePorts) Filter(_ context.Context, state *CycleState, _ *corev1.Pod, n *NodeInfo) *Status {
	for _, hp := range state.PodInfo.HostPorts {
		if n.portInUse(hp) {
			return NewStatus(Unschedulable, "node(s) didn't have free ports for the requested pod ports")
		}
	}
	return nil
}
