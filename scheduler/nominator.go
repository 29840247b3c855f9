package scheduler

import (
	"context"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// nominator remembers the pods that preempted others and the nodes they wait for (status
// nominatedNodeName), so that the room their victims free is kept for them: when another pod of no higher
// priority is filtered against such a node, the nominated pods count as if they were already there.
type nominator struct {
	mu     sync.Mutex
	byNode map[string]map[types.UID]*PodInfo
	nodeOf map[types.UID]string
}

func newNominator() *nominator {
	return &nominator{byNode: map[string]map[types.UID]*PodInfo{}, nodeOf: map[types.UID]string{}}
}

// set records (or, with node "", forgets) where a pending pod waits.
func (n *nominator) set(pod *corev1.Pod, node string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if old, ok := n.nodeOf[pod.UID]; ok {
		delete(n.byNode[old], pod.UID)
		if len(n.byNode[old]) == 0 {
			delete(n.byNode, old)
		}
		delete(n.nodeOf, pod.UID)
	}
	if node == "" {
		return
	}
	if n.byNode[node] == nil {
		n.byNode[node] = map[types.UID]*PodInfo{}
	}
	n.byNode[node][pod.UID] = NewPodInfo(pod)
	n.nodeOf[pod.UID] = node
}

// ahead returns, by node, the nominated pods that go before a pod of the given priority: those of the same
// or higher priority, other than the pod itself. It is taken once per scheduling cycle.
func (n *nominator) ahead(pod *corev1.Pod, priority int32, priorityOf func(*corev1.Pod) int32) map[string][]*PodInfo {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out map[string][]*PodInfo
	for node, pods := range n.byNode {
		for uid, p := range pods {
			if uid != pod.UID && priorityOf(p.Pod) >= priority {
				if out == nil {
					out = map[string][]*PodInfo{}
				}
				out[node] = append(out[node], p)
			}
		}
	}
	return out
}

// filterWithNominated runs the filters on a node as it will be once the pods nominated to it ahead of this
// one (state.nominated) are placed. The pre-filter state (affinity and spread counts) does not include them;
// resources and ports, which preemption frees, do.
func (s *Scheduler) filterWithNominated(ctx context.Context, state *CycleState, pod *corev1.Pod, n *NodeInfo) *Status {
	ahead := state.nominated[n.Name()]
	if len(ahead) == 0 {
		return s.runFilters(ctx, state, pod, n)
	}
	withNominated := n.clone()
	for _, p := range ahead {
		withNominated.addPod(p)
	}
	return s.runFilters(ctx, state, pod, withNominated)
}
