package scheduler

import (
	"context"
	"math"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
)

// podTopologySpread keeps the skew of matching pods across topology domains within maxSkew: as a filter
// for whenUnsatisfiable DoNotSchedule, as a score for ScheduleAnyway.
type podTopologySpread struct{}

func (podTopologySpread) Name() string { return "PodTopologySpread" }

// spreadConstraint is a constraint with its selector resolved and the matching pods counted per domain.
type spreadConstraint struct {
	maxSkew     int32
	topologyKey string
	minDomains  int32
	selector    labels.Selector
	selfMatch   int
	counts      map[string]int // domain value -> matching pods
	// honorAffinity and honorTaints are the constraint's nodeAffinityPolicy and nodeTaintsPolicy.
	honorAffinity, honorTaints bool
}

type spreadState struct {
	hard, soft []*spreadConstraint
}

func (p podTopologySpread) constraints(pod *corev1.Pod, when corev1.UnsatisfiableConstraintAction) []*spreadConstraint {
	var out []*spreadConstraint
	for _, c := range pod.Spec.TopologySpreadConstraints {
		if c.WhenUnsatisfiable != when {
			continue
		}
		sel := labels.Nothing()
		if c.LabelSelector != nil {
			if s, err := metav1.LabelSelectorAsSelector(c.LabelSelector); err == nil {
				sel = s
			}
		}
		sel = withPodLabelKeys(sel, pod, c.MatchLabelKeys, selection.In)
		sc := &spreadConstraint{maxSkew: c.MaxSkew, topologyKey: c.TopologyKey, selector: sel, counts: map[string]int{}, minDomains: 1,
			honorAffinity: c.NodeAffinityPolicy == nil || *c.NodeAffinityPolicy == corev1.NodeInclusionPolicyHonor,
			honorTaints:   c.NodeTaintsPolicy != nil && *c.NodeTaintsPolicy == corev1.NodeInclusionPolicyHonor}
		if c.MinDomains != nil {
			sc.minDomains = *c.MinDomains
		}
		if sel.Matches(labels.Set(pod.Labels)) {
			sc.selfMatch = 1
		}
		out = append(out, sc)
	}
	return out
}

// count fills each constraint's per-domain counts over the nodes that carry the keys of all the constraints
// and that the constraint's inclusion policies admit: nodeAffinityPolicy Honor (the default) counts only
// nodes the pod's nodeSelector and required node affinity allow, nodeTaintsPolicy Honor (Ignore by default)
// only nodes whose NoSchedule and NoExecute taints the pod tolerates, as in Kubernetes. Terminating pods do
// not count.
func (p podTopologySpread) count(pod *corev1.Pod, cs []*spreadConstraint, nodes []*NodeInfo, index podIndex) {
	if len(cs) == 0 {
		return
	}
	required := nodeaffinity.GetRequiredNodeAffinity(pod)
	// inclusion tells, once per node, whether the pod's node affinity and its tolerations admit it, for the
	// policies some constraint honours; each constraint then applies its own.
	var needAffinity, needTaints bool
	for _, c := range cs {
		needAffinity, needTaints = needAffinity || c.honorAffinity, needTaints || c.honorTaints
	}
	inclusion := func(n *NodeInfo) (affinityOK, taintsOK bool) {
		affinityOK, taintsOK = true, true
		if needAffinity {
			ok, err := required.Match(n.Node)
			affinityOK = ok && err == nil
		}
		if needTaints {
			_, untolerated := untoleratedTaint(pod, n)
			taintsOK = !untolerated
		}
		return affinityOK, taintsOK
	}
	matches := func(c *spreadConstraint, existing *corev1.Pod) bool {
		return existing.Namespace == pod.Namespace && existing.DeletionTimestamp == nil && c.selector.Matches(labels.Set(existing.Labels))
	}
	// With the label index, the matching pods come from it, and the node loop only registers the domains
	// and the admitted nodes.
	candidates := make([][]podOnNode, len(cs))
	indexed := index != nil
	for i, c := range cs {
		if indexed {
			candidates[i], indexed = index.candidates(c.selector)
		}
	}
	if c := cs[0]; indexed && len(cs) == 1 && !c.honorTaints && (!c.honorAffinity || !hasRequiredNodeAffinity(pod)) {
		// Every node with the key is admitted: the domains come from the cache, and no node is visited.
		for v := range index.domains(c.topologyKey) {
			c.counts[v] = 0
		}
		for _, existing := range candidates[0] {
			if v, ok := existing.node.Node.Labels[c.topologyKey]; ok && matches(c, existing.info.Pod) {
				c.counts[v]++
			}
		}
		return
	}
	admitted := make([]map[*NodeInfo]bool, len(cs))
	for i := range cs {
		if indexed {
			admitted[i] = map[*NodeInfo]bool{}
		}
	}
	for _, n := range nodes {
		if !hasKeys(n.Node.Labels, cs) {
			continue
		}
		affinityOK, taintsOK := inclusion(n)
		for i, c := range cs {
			if (c.honorAffinity && !affinityOK) || (c.honorTaints && !taintsOK) {
				continue
			}
			v := n.Node.Labels[c.topologyKey]
			matched := c.counts[v] // registers the domain even when no pod matches
			if indexed {
				admitted[i][n] = true
				c.counts[v] = matched
				continue
			}
			for _, existing := range n.Pods {
				if matches(c, existing.Pod) {
					matched++
				}
			}
			c.counts[v] = matched
		}
	}
	if !indexed {
		return
	}
	for i, c := range cs {
		for _, existing := range candidates[i] {
			if admitted[i][existing.node] && matches(c, existing.info.Pod) {
				c.counts[existing.node.Node.Labels[c.topologyKey]]++
			}
		}
	}
}

// hasKeys reports whether a node carries the topology key of every constraint: as in Kubernetes, only such
// nodes count.
func hasKeys(nodeLabels map[string]string, cs []*spreadConstraint) bool {
	for _, c := range cs {
		if _, ok := nodeLabels[c.topologyKey]; !ok {
			return false
		}
	}
	return true
}

// hasRequiredNodeAffinity reports whether the pod restricts its nodes by nodeSelector or required node
// affinity.
func hasRequiredNodeAffinity(pod *corev1.Pod) bool {
	a := pod.Spec.Affinity
	return len(pod.Spec.NodeSelector) > 0 || (a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil)
}

func (p podTopologySpread) PreFilter(_ context.Context, state *CycleState, pod *corev1.Pod, nodes []*NodeInfo) *Status {
	s := &spreadState{hard: p.constraints(pod, corev1.DoNotSchedule)}
	p.count(pod, s.hard, nodes, state.podIndex)
	state.Write(p.Name(), s)
	return nil
}

func (p podTopologySpread) Filter(_ context.Context, state *CycleState, _ *corev1.Pod, n *NodeInfo) *Status {
	s := state.Read(p.Name()).(*spreadState)
	for _, c := range s.hard {
		v, ok := n.Node.Labels[c.topologyKey]
		if !ok {
			return NewStatus(UnschedulableAndUnresolvable, "node(s) didn't match pod topology spread constraints (missing required label)")
		}
		minMatch := 0
		if int32(len(c.counts)) >= c.minDomains {
			minMatch = math.MaxInt
			for _, count := range c.counts {
				minMatch = min(minMatch, count)
			}
		}
		if c.counts[v]+c.selfMatch-minMatch > int(c.maxSkew) {
			return NewStatus(Unschedulable, "node(s) didn't match pod topology spread constraints")
		}
	}
	return nil
}

// PreScore counts matching pods per domain for the ScheduleAnyway constraints.
func (p podTopologySpread) PreScore(_ context.Context, state *CycleState, pod *corev1.Pod, _ []*NodeInfo) *Status {
	s, _ := state.Read(p.Name()).(*spreadState)
	if s == nil {
		s = &spreadState{}
		state.Write(p.Name(), s)
	}
	s.soft = p.constraints(pod, corev1.ScheduleAnyway)
	p.count(pod, s.soft, state.allNodes, state.podIndex)
	return nil
}

// Score is the number of matching pods in the node's domains, each constraint weighted by the log of its
// domain count so that spreading over many zones outweighs spreading over few; fewer is better.
func (p podTopologySpread) Score(_ context.Context, state *CycleState, _ *corev1.Pod, n *NodeInfo) (int64, *Status) {
	s := state.Read(p.Name()).(*spreadState)
	var score float64
	for _, c := range s.soft {
		v, ok := n.Node.Labels[c.topologyKey]
		if !ok {
			return -1, nil // marked: lowest after normalization
		}
		score += float64(c.counts[v]+c.selfMatch) * math.Log(float64(len(c.counts)+2))
	}
	return int64(math.Round(score)), nil
}

func (podTopologySpread) NormalizeScore(_ context.Context, _ *CycleState, _ *corev1.Pod, scores []NodeScore) *Status {
	var lo, hi int64 = math.MaxInt64, 0
	for _, s := range scores {
		if s.Score >= 0 {
			lo, hi = min(lo, s.Score), max(hi, s.Score)
		}
	}
	for i := range scores {
		switch {
		case scores[i].Score < 0:
			scores[i].Score = 0
		case hi == lo:
			scores[i].Score = MaxNodeScore
		default:
			scores[i].Score = MaxNodeScore * (hi - scores[i].Score) / (hi - lo)
		}
	}
	return nil
}
