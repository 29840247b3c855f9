package scheduler

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	resourcehelper "k8s.io/component-helpers/resource"
)

// Resource is an amount of each schedulable resource.
type Resource struct {
	MilliCPU         int64
	Memory           int64
	EphemeralStorage int64
	// AllowedPods is the pod count a node allows (allocatable only).
	AllowedPods int64
	// Scalar holds extended resources (example.com/gpu, hugepages-2Mi) in their base units.
	Scalar map[corev1.ResourceName]int64
}

func resourceFromList(list corev1.ResourceList) Resource {
	var r Resource
	for name, q := range list {
		switch name {
		case corev1.ResourceCPU:
			r.MilliCPU = q.MilliValue()
		case corev1.ResourceMemory:
			r.Memory = q.Value()
		case corev1.ResourceEphemeralStorage:
			r.EphemeralStorage = q.Value()
		case corev1.ResourcePods:
			r.AllowedPods = q.Value()
		default:
			if r.Scalar == nil {
				r.Scalar = map[corev1.ResourceName]int64{}
			}
			r.Scalar[name] = q.Value()
		}
	}
	return r
}

// add adds (sign 1) or subtracts (sign -1) another amount.
func (r *Resource) add(o Resource, sign int64) {
	r.MilliCPU += sign * o.MilliCPU
	r.Memory += sign * o.Memory
	r.EphemeralStorage += sign * o.EphemeralStorage
	for name, v := range o.Scalar {
		if r.Scalar == nil {
			r.Scalar = map[corev1.ResourceName]int64{}
		}
		r.Scalar[name] += sign * v
	}
}

func (r Resource) clone() Resource {
	c := r
	if r.Scalar != nil {
		c.Scalar = make(map[corev1.ResourceName]int64, len(r.Scalar))
		for k, v := range r.Scalar {
			c.Scalar[k] = v
		}
	}
	return c
}

// Requests that a container leaves unset count as these in scoring, as Kubernetes does, so that pods
// without requests still spread.
var nonZeroDefaults = corev1.ResourceList{
	corev1.ResourceCPU:    resource.MustParse("100m"),
	corev1.ResourceMemory: resource.MustParse("200Mi"),
}

// hostPort identifies a host port a pod claims.
type hostPort struct {
	IP       string
	Protocol corev1.Protocol
	Port     int32
}

// AffinityTerm is a pod (anti-)affinity term with its selectors resolved.
type AffinityTerm struct {
	Namespaces        sets.Set[string]
	NamespaceSelector labels.Selector // nil: only Namespaces
	Selector          labels.Selector
	TopologyKey       string
	Weight            int32 // for preferred terms
}

// Matches reports whether the term selects the pod; nsLabels gives a namespace's labels, looked up only
// for a term with a namespace selector.
func (t *AffinityTerm) Matches(pod *corev1.Pod, nsLabels func(string) labels.Set) bool {
	if !t.Namespaces.Has(pod.Namespace) && (t.NamespaceSelector == nil || !t.NamespaceSelector.Matches(nsLabels(pod.Namespace))) {
		return false
	}
	return t.Selector.Matches(labels.Set(pod.Labels))
}

// PodInfo is a pod with what scheduling needs from it computed once.
type PodInfo struct {
	Pod              *corev1.Pod
	Images           []string // normalized, of init and app containers
	Requests         Resource
	NonZeroRequests  Resource
	HostPorts        []hostPort
	RequiredAffinity []AffinityTerm
	RequiredAnti     []AffinityTerm
	PreferredAff     []AffinityTerm
	PreferredAnti    []AffinityTerm
}

// NewPodInfo computes a pod's requests (the Kubernetes rule: the larger of the largest init container and
// the sum of the app containers, sidecars included, plus overhead), host ports and affinity terms. A pod being
// resized in place counts with the larger of what its spec asks and what its node gave it
// (status.containerStatuses[].allocatedResources), as kube-scheduler counts it.
func NewPodInfo(pod *corev1.Pod) *PodInfo {
	p := &PodInfo{
		Pod:      pod,
		Requests: resourceFromList(resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{UseStatusResources: true})),
		NonZeroRequests: resourceFromList(resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{UseStatusResources: true,
			NonMissingContainerRequests: nonZeroDefaults})),
	}
	// Host ports of app containers and of sidecars (restartable init containers); ordinary init containers
	// have exited before the app starts, so theirs are free again.
	containers := append([]corev1.Container{}, pod.Spec.Containers...)
	for _, c := range pod.Spec.InitContainers {
		if c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			containers = append(containers, c)
		}
	}
	for _, c := range containers {
		for _, port := range c.Ports {
			if port.HostPort <= 0 {
				continue
			}
			ip := port.HostIP
			if ip == "" {
				ip = "0.0.0.0"
			}
			proto := port.Protocol
			if proto == "" {
				proto = corev1.ProtocolTCP
			}
			p.HostPorts = append(p.HostPorts, hostPort{IP: ip, Protocol: proto, Port: port.HostPort})
		}
	}
	for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		p.Images = append(p.Images, normalizeImage(c.Image))
	}
	if a := pod.Spec.Affinity; a != nil {
		if a.PodAffinity != nil {
			p.RequiredAffinity = affinityTerms(pod, a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution)
			p.PreferredAff = weightedAffinityTerms(pod, a.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution)
		}
		if a.PodAntiAffinity != nil {
			p.RequiredAnti = affinityTerms(pod, a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution)
			p.PreferredAnti = weightedAffinityTerms(pod, a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution)
		}
	}
	return p
}

func affinityTerms(pod *corev1.Pod, terms []corev1.PodAffinityTerm) []AffinityTerm {
	var out []AffinityTerm
	for _, t := range terms {
		out = append(out, newAffinityTerm(pod, t, 0))
	}
	return out
}

func weightedAffinityTerms(pod *corev1.Pod, terms []corev1.WeightedPodAffinityTerm) []AffinityTerm {
	var out []AffinityTerm
	for _, t := range terms {
		out = append(out, newAffinityTerm(pod, t.PodAffinityTerm, t.Weight))
	}
	return out
}

// newAffinityTerm resolves a term: no namespaces and no namespace selector mean the pod's own namespace;
// matchLabelKeys and mismatchLabelKeys become requirements on the pod's own label values.
func newAffinityTerm(pod *corev1.Pod, t corev1.PodAffinityTerm, weight int32) AffinityTerm {
	term := AffinityTerm{Namespaces: sets.New(t.Namespaces...), TopologyKey: t.TopologyKey, Weight: weight}
	if len(t.Namespaces) == 0 && t.NamespaceSelector == nil {
		term.Namespaces.Insert(pod.Namespace)
	}
	if t.NamespaceSelector != nil {
		if sel, err := metav1.LabelSelectorAsSelector(t.NamespaceSelector); err == nil {
			term.NamespaceSelector = sel
		} else {
			term.NamespaceSelector = labels.Nothing()
		}
	}
	sel := labels.Nothing()
	if t.LabelSelector != nil {
		if s, err := metav1.LabelSelectorAsSelector(t.LabelSelector); err == nil {
			sel = s
		}
	}
	sel = withPodLabelKeys(sel, pod, t.MatchLabelKeys, selection.In)
	term.Selector = withPodLabelKeys(sel, pod, t.MismatchLabelKeys, selection.NotIn)
	return term
}

// withPodLabelKeys adds to a selector, for each key the pod has a label for, a requirement that the key be
// (In) or not be (NotIn) the pod's own value: matchLabelKeys and mismatchLabelKeys.
func withPodLabelKeys(sel labels.Selector, pod *corev1.Pod, keys []string, op selection.Operator) labels.Selector {
	for _, key := range keys {
		if v, ok := pod.Labels[key]; ok {
			if r, err := labels.NewRequirement(key, op, []string{v}); err == nil {
				sel = sel.Add(*r)
			}
		}
	}
	return sel
}

// NodeInfo is a node with the pods bound or assumed on it and their totals.
type NodeInfo struct {
	Node             *corev1.Node
	Pods             []*PodInfo
	Allocatable      Resource
	Requested        Resource
	NonZeroRequested Resource
	usedPorts        map[hostPort]int
	// PodsWithAffinity and PodsWithRequiredAnti let affinity plugins skip the many pods without terms.
	PodsWithAffinity     []*PodInfo
	PodsWithRequiredAnti []*PodInfo
	images               map[string]int64 // normalized image name -> size in bytes
}

func newNodeInfo() *NodeInfo { return &NodeInfo{usedPorts: map[hostPort]int{}} }

// Name returns the node's name.
func (n *NodeInfo) Name() string {
	if n.Node == nil {
		return ""
	}
	return n.Node.Name
}

func (n *NodeInfo) setNode(node *corev1.Node) {
	n.Node = node
	n.Allocatable = resourceFromList(node.Status.Allocatable)
	n.images = map[string]int64{}
	for _, img := range node.Status.Images {
		for _, name := range img.Names {
			n.images[normalizeImage(name)] = img.SizeBytes
		}
	}
}

func (n *NodeInfo) addPod(p *PodInfo) {
	n.Pods = append(n.Pods, p)
	n.Requested.add(p.Requests, 1)
	n.NonZeroRequested.add(p.NonZeroRequests, 1)
	for _, hp := range p.HostPorts {
		n.usedPorts[hp]++
	}
	if len(p.RequiredAffinity)+len(p.RequiredAnti)+len(p.PreferredAff)+len(p.PreferredAnti) > 0 {
		n.PodsWithAffinity = append(n.PodsWithAffinity, p)
	}
	if len(p.RequiredAnti) > 0 {
		n.PodsWithRequiredAnti = append(n.PodsWithRequiredAnti, p)
	}
}

func (n *NodeInfo) removePod(uid types.UID) bool {
	i := indexOfPod(n.Pods, uid)
	if i < 0 {
		return false
	}
	p := n.Pods[i]
	n.Pods = removeAt(n.Pods, i)
	if j := indexOfPod(n.PodsWithAffinity, uid); j >= 0 {
		n.PodsWithAffinity = removeAt(n.PodsWithAffinity, j)
	}
	if j := indexOfPod(n.PodsWithRequiredAnti, uid); j >= 0 {
		n.PodsWithRequiredAnti = removeAt(n.PodsWithRequiredAnti, j)
	}
	n.Requested.add(p.Requests, -1)
	n.NonZeroRequested.add(p.NonZeroRequests, -1)
	for _, hp := range p.HostPorts {
		if n.usedPorts[hp]--; n.usedPorts[hp] <= 0 {
			delete(n.usedPorts, hp)
		}
	}
	return true
}

func indexOfPod(pods []*PodInfo, uid types.UID) int {
	for i, p := range pods {
		if p.Pod.UID == uid {
			return i
		}
	}
	return -1
}

// removeAt removes element i without keeping order, so removal stays cheap on crowded nodes.
func removeAt(pods []*PodInfo, i int) []*PodInfo {
	last := len(pods) - 1
	pods[i] = pods[last]
	pods[last] = nil
	return pods[:last]
}

// clone copies the node's bookkeeping, for preemption's what-if runs.
func (n *NodeInfo) clone() *NodeInfo {
	c := &NodeInfo{
		Node: n.Node, Allocatable: n.Allocatable, images: n.images,
		Pods:                 append([]*PodInfo(nil), n.Pods...),
		PodsWithAffinity:     append([]*PodInfo(nil), n.PodsWithAffinity...),
		PodsWithRequiredAnti: append([]*PodInfo(nil), n.PodsWithRequiredAnti...),
		Requested:            n.Requested.clone(), NonZeroRequested: n.NonZeroRequested.clone(),
		usedPorts: make(map[hostPort]int, len(n.usedPorts)),
	}
	for k, v := range n.usedPorts {
		c.usedPorts[k] = v
	}
	return c
}

// portInUse reports whether a host port conflicts with one already used: the same protocol and port, and
// the same IP or either side on 0.0.0.0.
func (n *NodeInfo) portInUse(want hostPort) bool {
	for used := range n.usedPorts {
		if used.Port == want.Port && used.Protocol == want.Protocol &&
			(used.IP == want.IP || used.IP == "0.0.0.0" || want.IP == "0.0.0.0") {
			return true
		}
	}
	return false
}

// normalizeImage turns "busybox" into "docker.io/library/busybox:latest", as container runtimes name
// images, so that pod images and node images compare.
func normalizeImage(name string) string {
	name, digest, hasDigest := strings.Cut(name, "@")
	first, _, hasSlash := strings.Cut(name, "/")
	if !hasSlash {
		name = "docker.io/library/" + name
	} else if !strings.ContainsAny(first, ".:") && first != "localhost" {
		name = "docker.io/" + name
	}
	if hasDigest {
		return name + "@" + digest // a digest names the image exactly; no tag is implied
	}
	lastSlash := strings.LastIndexByte(name, '/')
	if !strings.Contains(name[lastSlash+1:], ":") {
		name += ":latest"
	}
	return name
}
