package scheduler

import (
	"context"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// interPodAffinity applies required pod affinity and anti-affinity across topology domains, including the
// symmetry rule (an existing pod's anti-affinity also keeps the new pod away), and scores preferred terms.
type interPodAffinity struct{}

func (interPodAffinity) Name() string { return "InterPodAffinity" }

// topologyPair is one topology domain: a node label key and value.
type topologyPair struct{ key, value string }

type interPodAffinityState struct {
	// existingAnti counts, per domain, existing pods whose required anti-affinity selects the new pod.
	existingAnti map[topologyPair]int
	// existingAntiKeys are the topology keys in existingAnti, so Filter looks up a node's few domains
	// instead of walking every pair.
	existingAntiKeys []string
	// affinity counts, per domain of each term of the new pod, existing pods that match all its affinity
	// terms; anti counts, per domain, existing pods that a required anti-affinity term of the new pod
	// selects. Filter only asks whether a count is above zero, so counting may stop once it is.
	affinity map[topologyPair]int
	anti     map[topologyPair]int
	// scores sums, per domain, the preferred-term weights for PreScore.
	scores map[topologyPair]int64
}

func (p interPodAffinity) PreFilter(_ context.Context, state *CycleState, pod *corev1.Pod, nodes []*NodeInfo) *Status {
	info := state.PodInfo
	s := &interPodAffinityState{existingAnti: map[topologyPair]int{}, affinity: map[topologyPair]int{}, anti: map[topologyPair]int{}}
	// Scratch space reused from node to node.
	var affinityPairs, antiPairs []topologyPair
	var antiTerms []*AffinityTerm
	// The new pod's own terms look at the pods their selectors can match, through the cache's label index;
	// without it (or for selectors it cannot serve) at every pod, node by node, below.
	indexed := state.podIndex != nil && s.countIndexed(state)
	// Symmetry: only the pods with required anti-affinity need a look.
	symmetry := func(n *NodeInfo, existing *PodInfo) {
		for i := range existing.RequiredAnti {
			t := &existing.RequiredAnti[i]
			if v, ok := n.Node.Labels[t.TopologyKey]; ok && t.Matches(pod, state.NamespaceLabels) {
				s.existingAnti[topologyPair{t.TopologyKey, v}]++
				if !slices.Contains(s.existingAntiKeys, t.TopologyKey) {
					s.existingAntiKeys = append(s.existingAntiKeys, t.TopologyKey)
				}
			}
		}
	}
	for _, n := range nodes {
		for _, existing := range n.PodsWithRequiredAnti {
			symmetry(n, existing)
		}
		if indexed {
			continue
		}
		if len(info.RequiredAffinity) == 0 && len(info.RequiredAnti) == 0 {
			continue
		}
		// Filter asks only whether a domain holds a matching pod, so a domain already known to hold one
		// needs no more matching: with zone-wide terms most nodes are skipped.
		if len(n.Pods) == 0 {
			continue // nothing to count here
		}
		// A pod matching every affinity term counts, for each term whose key this node carries, in that
		// term's domain here (Kubernetes counts per term).
		affinityPairs = affinityPairs[:0]
		affinityNeeded := false
		for _, t := range info.RequiredAffinity {
			if v, ok := n.Node.Labels[t.TopologyKey]; ok {
				pair := topologyPair{t.TopologyKey, v}
				affinityPairs = append(affinityPairs, pair)
				affinityNeeded = affinityNeeded || s.affinity[pair] == 0
			}
		}
		antiTerms, antiPairs = antiTerms[:0], antiPairs[:0]
		for i := range info.RequiredAnti {
			t := &info.RequiredAnti[i]
			if v, ok := n.Node.Labels[t.TopologyKey]; ok && s.anti[topologyPair{t.TopologyKey, v}] == 0 {
				antiTerms, antiPairs = append(antiTerms, t), append(antiPairs, topologyPair{t.TopologyKey, v})
			}
		}
		if !affinityNeeded && len(antiTerms) == 0 {
			continue
		}
		for _, existing := range n.Pods {
			if affinityNeeded && matchesAll(info.RequiredAffinity, existing.Pod, state.NamespaceLabels) {
				for _, pair := range affinityPairs {
					s.affinity[pair]++
				}
			}
			for i, t := range antiTerms {
				if t.Matches(existing.Pod, state.NamespaceLabels) {
					s.anti[antiPairs[i]]++
				}
			}
		}
	}
	state.Write(p.Name(), s)
	return nil
}

// countIndexed counts the new pod's required affinity and anti-affinity matches from the label index. It
// returns false, having counted nothing, when a term's selector has no requirement the index serves.
func (s *interPodAffinityState) countIndexed(state *CycleState) bool {
	info := state.PodInfo
	type lookup struct {
		term *AffinityTerm
		pods []podOnNode
	}
	var anti []lookup
	for i := range info.RequiredAnti {
		pods, ok := state.podIndex.candidates(info.RequiredAnti[i].Selector)
		if !ok {
			return false
		}
		anti = append(anti, lookup{&info.RequiredAnti[i], pods})
	}
	// A pod counts for affinity only when it matches every term, so the term with the fewest candidates
	// bounds the search.
	var affinity []podOnNode
	for i := range info.RequiredAffinity {
		pods, ok := state.podIndex.candidates(info.RequiredAffinity[i].Selector)
		if !ok {
			return false
		}
		if i == 0 || len(pods) < len(affinity) {
			affinity = pods
		}
	}
	for _, l := range anti {
		for _, p := range l.pods {
			if v, ok := p.node.Node.Labels[l.term.TopologyKey]; ok && l.term.Matches(p.info.Pod, state.NamespaceLabels) {
				s.anti[topologyPair{l.term.TopologyKey, v}]++
			}
		}
	}
	for _, p := range affinity {
		if !matchesAll(info.RequiredAffinity, p.info.Pod, state.NamespaceLabels) {
			continue
		}
		for _, t := range info.RequiredAffinity {
			if v, ok := p.node.Node.Labels[t.TopologyKey]; ok {
				s.affinity[topologyPair{t.TopologyKey, v}]++
			}
		}
	}
	return true
}

func matchesAll(terms []AffinityTerm, pod *corev1.Pod, nsLabels func(string) labels.Set) bool {
	for i := range terms {
		if !terms[i].Matches(pod, nsLabels) {
			return false
		}
	}
	return true
}

func (p interPodAffinity) Filter(_ context.Context, state *CycleState, pod *corev1.Pod, n *NodeInfo) *Status {
	s := state.Read(p.Name()).(*interPodAffinityState)
	labels := n.Node.Labels
	for _, key := range s.existingAntiKeys {
		if v, ok := labels[key]; ok && s.existingAnti[topologyPair{key, v}] > 0 {
			return NewStatus(Unschedulable, "node(s) didn't satisfy existing pods anti-affinity rules")
		}
	}
	for _, t := range state.PodInfo.RequiredAnti {
		if v, ok := labels[t.TopologyKey]; ok && s.anti[topologyPair{t.TopologyKey, v}] > 0 {
			return NewStatus(Unschedulable, "node(s) didn't match pod anti-affinity rules")
		}
	}
	if terms := state.PodInfo.RequiredAffinity; len(terms) > 0 {
		satisfied := true
		for _, t := range terms {
			v, ok := labels[t.TopologyKey]
			if !ok || s.affinity[topologyPair{t.TopologyKey, v}] == 0 {
				satisfied = false
				break
			}
		}
		// The first pod of a group that selects itself may go anywhere its topology keys exist; otherwise
		// no pod of the group could ever start.
		if !satisfied && len(s.affinity) == 0 && matchesAll(terms, pod, state.NamespaceLabels) {
			satisfied = true
			for _, t := range terms {
				if _, ok := labels[t.TopologyKey]; !ok {
					satisfied = false
				}
			}
		}
		if !satisfied {
			return NewStatus(UnschedulableAndUnresolvable, "node(s) didn't match pod affinity rules")
		}
	}
	return nil
}

// PreScore sums, per topology domain, the weights of the preferred terms that pair the new pod with the
// pods already there, on every node (a domain holds its pods whether or not their nodes are feasible): the new pod's terms over existing pods, and existing pods' terms over the new pod
// (required affinity counts with weight 1, as Kubernetes' hardPodAffinityWeight does).
func (p interPodAffinity) PreScore(_ context.Context, state *CycleState, pod *corev1.Pod, _ []*NodeInfo) *Status {
	info, nodes := state.PodInfo, state.allNodes
	s, _ := state.Read(p.Name()).(*interPodAffinityState)
	if s == nil {
		s = &interPodAffinityState{}
		state.Write(p.Name(), s)
	}
	s.scores = map[topologyPair]int64{}
	hasOwnTerms := len(info.PreferredAff)+len(info.PreferredAnti) > 0
	add := func(n *NodeInfo, t *AffinityTerm, target *corev1.Pod, weight int64) {
		if v, ok := n.Node.Labels[t.TopologyKey]; ok && t.Matches(target, state.NamespaceLabels) {
			s.scores[topologyPair{t.TopologyKey, v}] += weight
		}
	}
	for _, n := range nodes {
		pods := n.PodsWithAffinity
		if hasOwnTerms {
			pods = n.Pods
		}
		for _, existing := range pods {
			for i := range info.PreferredAff {
				add(n, &info.PreferredAff[i], existing.Pod, int64(info.PreferredAff[i].Weight))
			}
			for i := range info.PreferredAnti {
				add(n, &info.PreferredAnti[i], existing.Pod, -int64(info.PreferredAnti[i].Weight))
			}
			for i := range existing.PreferredAff {
				add(n, &existing.PreferredAff[i], pod, int64(existing.PreferredAff[i].Weight))
			}
			for i := range existing.PreferredAnti {
				add(n, &existing.PreferredAnti[i], pod, -int64(existing.PreferredAnti[i].Weight))
			}
			for i := range existing.RequiredAffinity {
				add(n, &existing.RequiredAffinity[i], pod, 1)
			}
		}
	}
	return nil
}

func (p interPodAffinity) Score(_ context.Context, state *CycleState, _ *corev1.Pod, n *NodeInfo) (int64, *Status) {
	s := state.Read(p.Name()).(*interPodAffinityState)
	var score int64
	for pair, w := range s.scores {
		if v, ok := n.Node.Labels[pair.key]; ok && v == pair.value {
			score += w
		}
	}
	return score, nil
}

func (interPodAffinity) NormalizeScore(_ context.Context, _ *CycleState, _ *corev1.Pod, scores []NodeScore) *Status {
	minMaxNormalize(scores)
	return nil
}
