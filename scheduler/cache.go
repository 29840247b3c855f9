package scheduler

import (
	"fmt"
	"sort"
	"sync"

	corev1 "k8s.io/api/core/v1"
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
}

type cachedPod struct {
	info    *PodInfo
	node    string
	assumed bool
}

// NewCache returns an empty cache.
func NewCache() *Cache {
	return &Cache{nodes: map[string]*NodeInfo{}, pods: map[types.UID]*cachedPod{}, imageNodes: map[string]int{}}
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
	n.Node, n.images = nil, nil
	if len(n.Pods) == 0 {
		delete(c.nodes, name)
	}
	c.sorted = nil
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
	c.nodeInfo(node).addPod(info)
	c.pods[info.Pod.UID] = &cachedPod{info: info, node: node, assumed: assumed}
}

func (c *Cache) removePodLocked(uid types.UID) {
	p, ok := c.pods[uid]
	if !ok {
		return
	}
	delete(c.pods, uid)
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

// Node returns a node by name, or nil.
func (s *Snapshot) Node(name string) *NodeInfo {
	if n, ok := s.c.nodes[name]; ok && n.Node != nil {
		return n
	}
	return nil
}
