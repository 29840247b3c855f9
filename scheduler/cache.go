package scheduler

import (
	"fmt"
	"maps"
	"sort"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
)

// Cache is the scheduler's view of the nodes and of the pods that occupy them: the pods bound (from the
// informer) and the pods assumed (chosen a node, binding in flight). Scheduling cycles read it under the
// read lock; informer events and assumptions change it under the write lock.
type Cache struct {
	mu         sync.RWMutex
	nodes      map[string]*NodeInfo
	sorted     []*NodeInfo // the nodes whose Node object is known, by name; nil when it must be rebuilt
	pods       map[types.UID]*cachedPod
	imageNodes map[string]int // normalized image -> number of nodes that have it
	// byLabel indexes the pods by each of their labels, so that affinity and spread terms look at the pods
	// their selector can match instead of at every pod in the cluster.
	byLabel map[labelPair]map[types.UID]*cachedPod
	// domains caches, per topology key, how many known nodes carry each value; any change of a node's
	// labels or of the set of nodes clears it. Decisions fill it under the read lock, hence its own lock.
	domainsMu sync.Mutex
	domains   map[string]map[string]int
}

// labelPair is one label of a pod: its key and value.
type labelPair struct{ key, value string }

type cachedPod struct {
	info    *PodInfo
	node    string
	assumed bool
	// nodeInfo is c.nodes[node], which stays the same object while it holds a pod.
	nodeInfo *NodeInfo
}

// NewCache returns an empty cache.
func NewCache() *Cache {
	return &Cache{nodes: map[string]*NodeInfo{}, pods: map[types.UID]*cachedPod{}, imageNodes: map[string]int{},
		byLabel: map[labelPair]map[types.UID]*cachedPod{}, domains: map[string]map[string]int{}}
}

func (c *Cache) nodeInfo(name string) *NodeInfo {
	n, ok := c.nodes[name]
	if !ok {
		n = newNodeInfo()
		c.nodes[name] = n
	}
	return n
}

// SetNode adds or updates a node.
func (c *Cache) SetNode(node *corev1.Node) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodeInfo(node.Name)
	if n.Node == nil {
		c.sorted = nil
	}
	if n.Node == nil || !maps.Equal(n.Node.Labels, node.Labels) {
		c.clearDomains()
	}
	c.countImages(n, -1)
	n.setNode(node)
	c.countImages(n, 1)
}

// RemoveNode removes a node. Its pods stay accounted until their own deletes arrive.
func (c *Cache) RemoveNode(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, ok := c.nodes[name]
	if !ok {
		return
	}
	c.countImages(n, -1)
	c.clearDomains()
	n.Node, n.images = nil, nil
	if len(n.Pods) == 0 {
		delete(c.nodes, name)
	}
	c.sorted = nil
}

func (c *Cache) clearDomains() {
	c.domainsMu.Lock()
	c.domains = map[string]map[string]int{}
	c.domainsMu.Unlock()
}

func (c *Cache) countImages(n *NodeInfo, sign int) {
	for img := range n.images {
		if c.imageNodes[img] += sign; c.imageNodes[img] <= 0 {
			delete(c.imageNodes, img)
		}
	}
}

// SetPod records a pod bound to a node, confirming an assumption if there was one. A pod that has
// finished (Succeeded or Failed) no longer occupies its node and is removed.
func (c *Cache) SetPod(pod *corev1.Pod) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.removePodLocked(pod.UID)
	if pod.Spec.NodeName == "" || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return
	}
	c.addPodLocked(NewPodInfo(pod), pod.Spec.NodeName, false)
}

// RemovePod forgets a pod.
func (c *Cache) RemovePod(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.removePodLocked(uid)
}

// Assume counts a pod against a node before its binding is stored, so that the next decision sees it.
func (c *Cache) Assume(info *PodInfo, node string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.pods[info.Pod.UID]; ok {
		return fmt.Errorf("pod %s/%s is already in the cache", info.Pod.Namespace, info.Pod.Name)
	}
	c.addPodLocked(info, node, true)
	return nil
}

// Forget drops an assumption whose binding failed. A pod the informer has since confirmed is kept.
func (c *Cache) Forget(uid types.UID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.pods[uid]; ok && p.assumed {
		c.removePodLocked(uid)
	}
}

func (c *Cache) addPodLocked(info *PodInfo, node string, assumed bool) {
	n := c.nodeInfo(node)
	n.addPod(info)
	cp := &cachedPod{info: info, node: node, assumed: assumed, nodeInfo: n}
	c.pods[info.Pod.UID] = cp
	for k, v := range info.Pod.Labels {
		pods := c.byLabel[labelPair{k, v}]
		if pods == nil {
			pods = map[types.UID]*cachedPod{}
			c.byLabel[labelPair{k, v}] = pods
		}
		pods[info.Pod.UID] = cp
	}
}

func (c *Cache) removePodLocked(uid types.UID) {
	p, ok := c.pods[uid]
	if !ok {
		return
	}
	delete(c.pods, uid)
	for k, v := range p.info.Pod.Labels {
		if pods := c.byLabel[labelPair{k, v}]; pods != nil {
			if delete(pods, uid); len(pods) == 0 {
				delete(c.byLabel, labelPair{k, v})
			}
		}
	}
	if n, ok := c.nodes[p.node]; ok {
		n.removePod(uid)
		if n.Node == nil && len(n.Pods) == 0 {
			delete(c.nodes, p.node)
		}
	}
}

// Snapshot is a read-only view of the cache for one scheduling cycle; Release ends it.
type Snapshot struct {
	c *Cache
	// Nodes are the known nodes, by name.
	Nodes []*NodeInfo
	// ImageNodes counts the nodes that hold each image.
	ImageNodes map[string]int
}

// Snapshot read-locks the cache until Release. Informer updates wait meanwhile, so cycles stay short.
func (c *Cache) Snapshot() *Snapshot {
	c.mu.RLock()
	for c.sorted == nil { // a writer may clear it again between the unlock and the read lock
		c.mu.RUnlock()
		c.mu.Lock()
		if c.sorted == nil {
			sorted := make([]*NodeInfo, 0, len(c.nodes))
			for _, n := range c.nodes {
				if n.Node != nil {
					sorted = append(sorted, n)
				}
			}
			sort.Slice(sorted, func(i, j int) bool { return sorted[i].Node.Name < sorted[j].Node.Name })
			c.sorted = sorted
		}
		c.mu.Unlock()
		c.mu.RLock()
	}
	return &Snapshot{c: c, Nodes: c.sorted, ImageNodes: c.imageNodes}
}

// Release ends the snapshot.
func (s *Snapshot) Release() { s.c.mu.RUnlock() }

// podOnNode is a pod of the cache and the node it is bound or assumed to.
type podOnNode struct {
	info *PodInfo
	node *NodeInfo
}

// candidates returns the pods on known nodes that sel may match: through the label index, those carrying a
// value that one of sel's equality (=, ==, in) requirements accepts, for the requirement with the fewest such
// pods. They still have to be matched against the whole selector. ok is false when sel has no equality
// requirement, and every pod must be examined.
func (s *Snapshot) candidates(sel labels.Selector) (pods []podOnNode, ok bool) {
	reqs, selectable := sel.Requirements()
	if !selectable {
		return nil, true // labels.Nothing()
	}
	best, bestCount := -1, 0
	for i, r := range reqs {
		switch r.Operator() {
		case selection.Equals, selection.DoubleEquals, selection.In:
		default:
			continue
		}
		count := 0
		for v := range r.Values() {
			count += len(s.c.byLabel[labelPair{r.Key(), v}])
		}
		if best < 0 || count < bestCount {
			best, bestCount = i, count
		}
	}
	if best < 0 {
		return nil, false
	}
	pods = make([]podOnNode, 0, bestCount)
	for v := range reqs[best].Values() {
		for _, p := range s.c.byLabel[labelPair{reqs[best].Key(), v}] {
			if p.nodeInfo.Node != nil {
				pods = append(pods, podOnNode{info: p.info, node: p.nodeInfo})
			}
		}
	}
	return pods, true
}

// domains returns how many known nodes carry each value of a node label: the topology domains of key. The
// map is shared; callers must not change it.
func (s *Snapshot) domains(key string) map[string]int {
	c := s.c
	c.domainsMu.Lock()
	defer c.domainsMu.Unlock()
	if d, ok := c.domains[key]; ok {
		return d
	}
	d := map[string]int{}
	for _, n := range s.Nodes {
		if v, ok := n.Node.Labels[key]; ok {
			d[v]++
		}
	}
	c.domains[key] = d
	return d
}

// Node returns a node by name, or nil.
func (s *Snapshot) Node(name string) *NodeInfo {
	if n, ok := s.c.nodes[name]; ok && n.Node != nil {
		return n
	}
	return nil
}
