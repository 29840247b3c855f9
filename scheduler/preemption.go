package scheduler

import (
	"context"
	"errors"
	"math"
	"sort"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// maxPreemptionCandidates bounds the nodes examined for preemption, so that a large cluster stays quick.
const maxPreemptionCandidates = 100

// preemptionCandidate is a node and the pods that would have to leave it.
type preemptionCandidate struct {
	node    string
	victims []*PodInfo
}

// findPreemption looks, under the snapshot, for a node where evicting pods of lower priority would let the
// pod fit. If an earlier preemption for this pod is still under way (its victims are terminating), it returns
// no candidate and that node, so that no more pods are evicted meanwhile.
func (s *Scheduler) findPreemption(ctx context.Context, info *PodInfo, snap *Snapshot, fitErr *FitError) (*preemptionCandidate, string) {
	pod := info.Pod
	if pod.Spec.PreemptionPolicy != nil && *pod.Spec.PreemptionPolicy == corev1.PreemptNever {
		return nil, ""
	}
	priority := s.podPriority(pod)
	if nominated := snap.Node(pod.Status.NominatedNodeName); nominated != nil {
		for _, p := range nominated.Pods {
			if p.Pod.DeletionTimestamp != nil && s.podPriority(p.Pod) < priority {
				return nil, pod.Status.NominatedNodeName
			}
		}
	}
	var best *preemptionCandidate
	examined := 0
	for _, n := range snap.Nodes {
		if st := fitErr.Statuses[n.Name()]; st.Code() != Unschedulable {
			continue // fits already, or no eviction can help
		}
		if examined++; examined > maxPreemptionCandidates {
			break
		}
		if c := s.victimsOn(ctx, info, priority, n, snap); c != nil && (best == nil || s.better(c, best)) {
			best = c
		}
	}
	return best, ""
}

// preempt evicts a candidate's victims through the eviction subresource (graceful deletion) and records
// Preempted events. The pod itself waits, parked, until the victims' deletes requeue it.
func (s *Scheduler) preempt(ctx context.Context, pod *corev1.Pod, c *preemptionCandidate) {
	for _, v := range c.victims {
		victim := v.Pod
		s.recorder.Eventf(victim, corev1.EventTypeNormal, "Preempted", "Preempted by pod %s on node %s", pod.UID, c.node)
		s.goBounded(ctx, func() { s.evict(ctx, victim) })
	}
	s.logger.Info("preempting", "pod", pod.Namespace+"/"+pod.Name, "node", c.node, "victims", len(c.victims))
}

// victimsOn removes every lower-priority pod from a copy of the node; if the pod then fits, it puts back as
// many of them as still leave room, highest priority first, and returns the rest.
func (s *Scheduler) victimsOn(ctx context.Context, info *PodInfo, priority int32, n *NodeInfo, snap *Snapshot) *preemptionCandidate {
	trial := n.clone()
	var removed []*PodInfo
	for _, p := range n.Pods {
		if s.podPriority(p.Pod) < priority {
			trial.removePod(p.Pod.UID)
			removed = append(removed, p)
		}
	}
	if len(removed) == 0 || !s.fitsOn(ctx, info, trial, snap) {
		return nil
	}
	sort.Slice(removed, func(i, j int) bool {
		pi, pj := s.podPriority(removed[i].Pod), s.podPriority(removed[j].Pod)
		if pi != pj {
			return pi > pj
		}
		// Older pods are put back first, so that among equals the newer ones leave.
		return removed[i].Pod.CreationTimestamp.Before(&removed[j].Pod.CreationTimestamp)
	})
	c := &preemptionCandidate{node: n.Name()}
	for _, p := range removed {
		trial.addPod(p)
		if !s.fitsOn(ctx, info, trial, snap) {
			trial.removePod(p.Pod.UID)
			c.victims = append(c.victims, p)
		}
	}
	return c
}

// fitsOn runs the pre-filters and filters with one node replaced by its what-if copy.
func (s *Scheduler) fitsOn(ctx context.Context, info *PodInfo, trial *NodeInfo, snap *Snapshot) bool {
	nodes := make([]*NodeInfo, len(snap.Nodes))
	for i, n := range snap.Nodes {
		if n.Name() == trial.Name() {
			n = trial
		}
		nodes[i] = n
	}
	state := NewCycleState(info, s.namespaceLabels)
	state.NodeCount, state.ImageNodes, state.allNodes = len(nodes), snap.ImageNodes, nodes
	for _, p := range s.preFilters {
		if !p.PreFilter(ctx, state, info.Pod, nodes).IsSuccess() {
			return false
		}
	}
	return s.runFilters(ctx, state, info.Pod, trial).IsSuccess()
}

// better orders candidates as Kubernetes does: the lowest highest-victim priority, then the lowest sum of
// victim priorities, then the fewest victims.
func (s *Scheduler) better(a, b *preemptionCandidate) bool {
	stats := func(c *preemptionCandidate) (highest int32, sum int64) {
		highest = math.MinInt32
		for _, v := range c.victims {
			p := s.podPriority(v.Pod)
			// Offset to positive, as Kubernetes does, so that more victims of negative priority never
			// add up to less.
			highest, sum = max(highest, p), sum+int64(p)+math.MaxInt32+1
		}
		return highest, sum
	}
	ha, sa := stats(a)
	hb, sb := stats(b)
	if ha != hb {
		return ha < hb
	}
	if sa != sb {
		return sa < sb
	}
	return len(a.victims) < len(b.victims)
}

// evict asks the API to evict a victim, which deletes it gracefully.
func (s *Scheduler) evict(ctx context.Context, victim *corev1.Pod) {
	eviction := &policyv1.Eviction{
		ObjectMeta:    metav1.ObjectMeta{Namespace: victim.Namespace, Name: victim.Name},
		DeleteOptions: &metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &victim.UID}},
	}
	err := s.client.PolicyV1().Evictions(victim.Namespace).Evict(ctx, eviction)
	if err != nil && !apierrors.IsNotFound(err) && !errors.Is(err, context.Canceled) {
		s.logger.Warn("evicting preemption victim", "pod", victim.Namespace+"/"+victim.Name, "error", err)
	}
}
