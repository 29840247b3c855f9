package scheduler

import (
	"context"
	"fmt"
	"reflect"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
)

// ---------------------------------------------------------------------------------------------------------
// Builders and helpers.
// ---------------------------------------------------------------------------------------------------------

const (
	zoneKey = "topology.kubernetes.io/zone"
	hostKey = "kubernetes.io/hostname"
	gpu     = corev1.ResourceName("example.com/gpu")
	mib     = int64(1024 * 1024)
)

var uidSeq atomic.Int64

// makeNode builds a node with allocatable cpu, memory and pods (an empty string leaves the resource out),
// 50Gi of ephemeral storage, the hostname label and the given labels and taints.
func makeNode(name, cpu, mem, pods string, lbls map[string]string, taints ...corev1.Taint) *corev1.Node {
	alloc := corev1.ResourceList{corev1.ResourceEphemeralStorage: resource.MustParse("50Gi")}
	if cpu != "" {
		alloc[corev1.ResourceCPU] = resource.MustParse(cpu)
	}
	if mem != "" {
		alloc[corev1.ResourceMemory] = resource.MustParse(mem)
	}
	if pods != "" {
		alloc[corev1.ResourcePods] = resource.MustParse(pods)
	}
	l := map[string]string{hostKey: name}
	for k, v := range lbls {
		l[k] = v
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l},
		Spec:       corev1.NodeSpec{Taints: taints},
		Status:     corev1.NodeStatus{Allocatable: alloc, Capacity: alloc},
	}
}

// stdNode is a roomy node (8 cpu, 16Gi, 110 pods) with labels.
func stdNode(name string, lbls map[string]string, taints ...corev1.Taint) *corev1.Node {
	return makeNode(name, "8", "16Gi", "110", lbls, taints...)
}

// makePod builds a pod in namespace "default" with a unique UID and one container requesting cpu and
// memory (an empty string leaves the request out).
func makePod(name, cpu, mem string, lbls map[string]string) *corev1.Pod {
	c := corev1.Container{Name: "app", Image: "registry.local/app:1"}
	if cpu != "" || mem != "" {
		c.Resources.Requests = corev1.ResourceList{}
		if cpu != "" {
			c.Resources.Requests[corev1.ResourceCPU] = resource.MustParse(cpu)
		}
		if mem != "" {
			c.Resources.Requests[corev1.ResourceMemory] = resource.MustParse(mem)
		}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "default", Labels: lbls,
			UID: types.UID(fmt.Sprintf("uid-%s-%d", name, uidSeq.Add(1))),
		},
		Spec: corev1.PodSpec{SchedulerName: SchedulerName, Containers: []corev1.Container{c}},
	}
}

// with applies mutations to a pod and returns it.
func with(p *corev1.Pod, mutate ...func(*corev1.Pod)) *corev1.Pod {
	for _, m := range mutate {
		m(p)
	}
	return p
}

func rl(kv ...string) corev1.ResourceList {
	out := corev1.ResourceList{}
	for i := 0; i+1 < len(kv); i += 2 {
		out[corev1.ResourceName(kv[i])] = resource.MustParse(kv[i+1])
	}
	return out
}

func inNamespace(ns string) func(*corev1.Pod) { return func(p *corev1.Pod) { p.Namespace = ns } }

func tolerating(ts ...corev1.Toleration) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Spec.Tolerations = append(p.Spec.Tolerations, ts...) }
}

func withNodeSelector(sel map[string]string) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Spec.NodeSelector = sel }
}

func withPriority(v int32) func(*corev1.Pod) { return func(p *corev1.Pod) { p.Spec.Priority = &v } }

func createdAt(t time.Time) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.CreationTimestamp = metav1.NewTime(t) }
}

func terminating() func(*corev1.Pod) {
	return func(p *corev1.Pod) { now := metav1.Now(); p.DeletionTimestamp = &now }
}

func withRequests(list corev1.ResourceList) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Spec.Containers[0].Resources.Requests = list }
}

func withContainer(name string, list corev1.ResourceList) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: name, Image: "registry.local/app:1", Resources: corev1.ResourceRequirements{Requests: list}})
	}
}

func withInit(name string, list corev1.ResourceList, sidecar bool) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		c := corev1.Container{Name: name, Image: "registry.local/init:1", Resources: corev1.ResourceRequirements{Requests: list}}
		if sidecar {
			always := corev1.ContainerRestartPolicyAlways
			c.RestartPolicy = &always
		}
		p.Spec.InitContainers = append(p.Spec.InitContainers, c)
	}
}

func withOverhead(list corev1.ResourceList) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Spec.Overhead = list }
}

func withHostPorts(ports ...corev1.ContainerPort) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Spec.Containers[0].Ports = append(p.Spec.Containers[0].Ports, ports...) }
}

func withImage(images ...string) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.Containers = nil
		for i, img := range images {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: fmt.Sprintf("c%d", i), Image: img})
		}
	}
}

func ensureAffinity(p *corev1.Pod) *corev1.Affinity {
	if p.Spec.Affinity == nil {
		p.Spec.Affinity = &corev1.Affinity{}
	}
	return p.Spec.Affinity
}

func requiredNodeAffinity(terms ...corev1.NodeSelectorTerm) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		a := ensureAffinity(p)
		if a.NodeAffinity == nil {
			a.NodeAffinity = &corev1.NodeAffinity{}
		}
		a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{NodeSelectorTerms: terms}
	}
}

func preferredNodeAffinity(terms ...corev1.PreferredSchedulingTerm) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		a := ensureAffinity(p)
		if a.NodeAffinity == nil {
			a.NodeAffinity = &corev1.NodeAffinity{}
		}
		a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution = terms
	}
}

func expr(key string, op corev1.NodeSelectorOperator, values ...string) corev1.NodeSelectorRequirement {
	return corev1.NodeSelectorRequirement{Key: key, Operator: op, Values: values}
}

func exprTerm(reqs ...corev1.NodeSelectorRequirement) corev1.NodeSelectorTerm {
	return corev1.NodeSelectorTerm{MatchExpressions: reqs}
}

// podTerm is a pod (anti-)affinity term selecting sel over topologyKey in the given namespaces (none: the
// pod's own).
func podTerm(topologyKey string, sel map[string]string, namespaces ...string) corev1.PodAffinityTerm {
	return corev1.PodAffinityTerm{
		LabelSelector: &metav1.LabelSelector{MatchLabels: sel},
		TopologyKey:   topologyKey,
		Namespaces:    namespaces,
	}
}

func requiredPodAffinity(terms ...corev1.PodAffinityTerm) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		a := ensureAffinity(p)
		if a.PodAffinity == nil {
			a.PodAffinity = &corev1.PodAffinity{}
		}
		a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution = append(a.PodAffinity.RequiredDuringSchedulingIgnoredDuringExecution, terms...)
	}
}

func requiredPodAnti(terms ...corev1.PodAffinityTerm) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		a := ensureAffinity(p)
		if a.PodAntiAffinity == nil {
			a.PodAntiAffinity = &corev1.PodAntiAffinity{}
		}
		a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution = append(a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution, terms...)
	}
}

func preferredPodAffinity(weight int32, term corev1.PodAffinityTerm) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		a := ensureAffinity(p)
		if a.PodAffinity == nil {
			a.PodAffinity = &corev1.PodAffinity{}
		}
		a.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution = append(a.PodAffinity.PreferredDuringSchedulingIgnoredDuringExecution,
			corev1.WeightedPodAffinityTerm{Weight: weight, PodAffinityTerm: term})
	}
}

func preferredPodAnti(weight int32, term corev1.PodAffinityTerm) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		a := ensureAffinity(p)
		if a.PodAntiAffinity == nil {
			a.PodAntiAffinity = &corev1.PodAntiAffinity{}
		}
		a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution = append(a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution,
			corev1.WeightedPodAffinityTerm{Weight: weight, PodAffinityTerm: term})
	}
}

func spreadConstraintOn(key string, maxSkew int32, when corev1.UnsatisfiableConstraintAction, sel map[string]string, minDomains *int32) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Spec.TopologySpreadConstraints = append(p.Spec.TopologySpreadConstraints, corev1.TopologySpreadConstraint{
			MaxSkew: maxSkew, TopologyKey: key, WhenUnsatisfiable: when,
			LabelSelector: &metav1.LabelSelector{MatchLabels: sel}, MinDomains: minDomains,
		})
	}
}

// withSpreadPolicies sets the node inclusion policies of the pod's spread constraints ("" leaves one unset).
func withSpreadPolicies(affinity, taints corev1.NodeInclusionPolicy) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		for i := range p.Spec.TopologySpreadConstraints {
			c := &p.Spec.TopologySpreadConstraints[i]
			if affinity != "" {
				c.NodeAffinityPolicy = &affinity
			}
			if taints != "" {
				c.NodeTaintsPolicy = &taints
			}
		}
	}
}

func int32p(v int32) *int32 { return &v }

// nodeInfoOf builds a NodeInfo for a node with pods already on it.
func nodeInfoOf(node *corev1.Node, pods ...*corev1.Pod) *NodeInfo {
	n := newNodeInfo()
	n.setNode(node)
	for _, p := range pods {
		p.Spec.NodeName = node.Name
		n.addPod(NewPodInfo(p))
	}
	return n
}

// newState builds a cycle state as Scheduler.decide does.
func newState(pod *corev1.Pod, all []*NodeInfo, nsLabels map[string]labels.Set) *CycleState {
	var fn func(string) labels.Set
	if nsLabels != nil {
		fn = func(ns string) labels.Set { return nsLabels[ns] }
	}
	state := NewCycleState(NewPodInfo(pod), fn)
	imageNodes := map[string]int{}
	for _, n := range all {
		for img := range n.images {
			imageNodes[img]++
		}
	}
	state.NodeCount, state.ImageNodes, state.allNodes = len(all), imageNodes, all
	return state
}

// filterAll runs the plugin's PreFilter (if any) over all nodes, then its Filter on each node.
func filterAll(t *testing.T, p FilterPlugin, pod *corev1.Pod, all []*NodeInfo, nsLabels map[string]labels.Set) map[string]*Status {
	t.Helper()
	out := filterAllOnce(t, p, pod, all, nsLabels, false)
	// The same through the cache's label index must decide the same.
	if indexed := filterAllOnce(t, p, pod, all, nsLabels, true); !reflect.DeepEqual(indexed, out) {
		t.Errorf("%s: with the label index %v, without %v", p.Name(), indexed, out)
	}
	return out
}

// indexedView copies the nodes and their pods into a cache and returns its snapshot (the caller releases
// it) and the snapshot's copies of all, in the same order.
func indexedView(all []*NodeInfo) (*Snapshot, []*NodeInfo) {
	c := NewCache()
	for _, n := range all {
		c.SetNode(n.Node)
		for _, p := range n.Pods {
			c.mu.Lock()
			c.addPodLocked(p, n.Name(), false)
			c.mu.Unlock()
		}
	}
	snap := c.Snapshot()
	nodes := make([]*NodeInfo, len(all))
	for i, n := range all {
		nodes[i] = snap.Node(n.Name())
	}
	return snap, nodes
}

func filterAllOnce(t *testing.T, p FilterPlugin, pod *corev1.Pod, all []*NodeInfo, nsLabels map[string]labels.Set, index bool) map[string]*Status {
	t.Helper()
	ctx := context.Background()
	var snap *Snapshot
	if index {
		snap, all = indexedView(all)
		defer snap.Release()
	}
	state := newState(pod, all, nsLabels)
	if snap != nil {
		state.podIndex = snap
	}
	if pf, ok := p.(PreFilterPlugin); ok {
		if st := pf.PreFilter(ctx, state, pod, all); !st.IsSuccess() {
			t.Fatalf("%s PreFilter: %v", p.Name(), st)
		}
	}
	out := map[string]*Status{}
	for _, n := range all {
		out[n.Name()] = p.Filter(ctx, state, pod, n)
	}
	return out
}

// filterOne runs PreFilter over the single node and Filter on it.
func filterOne(t *testing.T, p FilterPlugin, pod *corev1.Pod, n *NodeInfo) *Status {
	t.Helper()
	return filterAll(t, p, pod, []*NodeInfo{n}, nil)[n.Name()]
}

// scoreAll runs PreFilter (over all nodes) and PreScore (over the feasible nodes) if the plugin has them,
// then Score on each feasible node and NormalizeScore if the plugin has it.
func scoreAll(t *testing.T, p ScorePlugin, pod *corev1.Pod, all, feasible []*NodeInfo, nsLabels map[string]labels.Set) map[string]int64 {
	t.Helper()
	out := scoreAllOnce(t, p, pod, all, feasible, nsLabels, false)
	if indexed := scoreAllOnce(t, p, pod, all, feasible, nsLabels, true); !reflect.DeepEqual(indexed, out) {
		t.Errorf("%s: scores with the label index %v, without %v", p.Name(), indexed, out)
	}
	return out
}

func scoreAllOnce(t *testing.T, p ScorePlugin, pod *corev1.Pod, all, feasible []*NodeInfo, nsLabels map[string]labels.Set, index bool) map[string]int64 {
	t.Helper()
	ctx := context.Background()
	var snap *Snapshot
	if index {
		snap, all = indexedView(all)
		defer snap.Release()
		copies := make([]*NodeInfo, len(feasible))
		for i, n := range feasible {
			copies[i] = snap.Node(n.Name())
		}
		feasible = copies
	}
	state := newState(pod, all, nsLabels)
	if snap != nil {
		state.podIndex = snap
	}
	if pf, ok := p.(PreFilterPlugin); ok {
		if st := pf.PreFilter(ctx, state, pod, all); !st.IsSuccess() {
			t.Fatalf("%s PreFilter: %v", p.Name(), st)
		}
	}
	if ps, ok := p.(PreScorePlugin); ok {
		if st := ps.PreScore(ctx, state, pod, feasible); !st.IsSuccess() {
			t.Fatalf("%s PreScore: %v", p.Name(), st)
		}
	}
	scores := make([]NodeScore, len(feasible))
	for i, n := range feasible {
		v, st := p.Score(ctx, state, pod, n)
		if !st.IsSuccess() {
			t.Fatalf("%s Score(%s): %v", p.Name(), n.Name(), st)
		}
		scores[i] = NodeScore{Name: n.Name(), Score: v}
	}
	if norm, ok := p.(ScoreNormalizer); ok {
		if st := norm.NormalizeScore(ctx, state, pod, scores); !st.IsSuccess() {
			t.Fatalf("%s NormalizeScore: %v", p.Name(), st)
		}
	}
	out := map[string]int64{}
	for _, s := range scores {
		out[s.Name] = s.Score
	}
	return out
}

// want is an expected filter status: a code and the exact reasons (none for Success).
type want struct {
	code    Code
	reasons []string
}

var pass = want{code: Success}

func reject(code Code, reasons ...string) want { return want{code: code, reasons: reasons} }

func checkStatus(t *testing.T, what string, got *Status, w want) {
	t.Helper()
	if got.Code() != w.code {
		t.Errorf("%s: code = %v (%v), want %v (%v)", what, got.Code(), got, w.code, w.reasons)
		return
	}
	if len(got.Reasons()) == 0 && len(w.reasons) == 0 {
		return
	}
	if !reflect.DeepEqual(got.Reasons(), w.reasons) {
		t.Errorf("%s: reasons = %q, want %q", what, got.Reasons(), w.reasons)
	}
}

const (
	reasonUnschedulable   = "node(s) were unschedulable"
	reasonNodeName        = "node(s) didn't match the requested node name"
	reasonNodeAffinity    = "node(s) didn't match Pod's node affinity/selector"
	reasonPorts           = "node(s) didn't have free ports for the requested pod ports"
	reasonPodAffinity     = "node(s) didn't match pod affinity rules"
	reasonPodAnti         = "node(s) didn't match pod anti-affinity rules"
	reasonExistingAnti    = "node(s) didn't satisfy existing pods anti-affinity rules"
	reasonSpread          = "node(s) didn't match pod topology spread constraints"
	reasonSpreadNoLabel   = "node(s) didn't match pod topology spread constraints (missing required label)"
	reasonInsufficientCPU = "Insufficient cpu"
	reasonInsufficientMem = "Insufficient memory"
)

// ---------------------------------------------------------------------------------------------------------
// NodeUnschedulable and NodeName.
// ---------------------------------------------------------------------------------------------------------

func TestNodeUnschedulableFilter(t *testing.T) {
	cordoned := func() *corev1.Node {
		n := stdNode("n1", nil)
		n.Spec.Unschedulable = true
		return n
	}
	tests := []struct {
		name string
		pod  *corev1.Pod
		node *corev1.Node
		want want
	}{
		{"schedulable node, no tolerations", makePod("p", "", "", nil), stdNode("n1", nil), pass},
		{"cordoned node, no tolerations", makePod("p", "", "", nil), cordoned(),
			reject(UnschedulableAndUnresolvable, reasonUnschedulable)},
		{"cordoned node, toleration for unschedulable:NoSchedule", with(makePod("p", "", "", nil), tolerating(corev1.Toleration{
			Key: corev1.TaintNodeUnschedulable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule})), cordoned(), pass},
		{"cordoned node, Equal toleration with empty value and any effect", with(makePod("p", "", "", nil), tolerating(corev1.Toleration{
			Key: corev1.TaintNodeUnschedulable, Operator: corev1.TolerationOpEqual})), cordoned(), pass},
		{"cordoned node, Exists with empty key tolerates everything", with(makePod("p", "", "", nil), tolerating(corev1.Toleration{
			Operator: corev1.TolerationOpExists})), cordoned(), pass},
		{"cordoned node, toleration with the wrong effect", with(makePod("p", "", "", nil), tolerating(corev1.Toleration{
			Key: corev1.TaintNodeUnschedulable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute})), cordoned(),
			reject(UnschedulableAndUnresolvable, reasonUnschedulable)},
		{"cordoned node, toleration for another key", with(makePod("p", "", "", nil), tolerating(corev1.Toleration{
			Key: "dedicated", Operator: corev1.TolerationOpExists})), cordoned(),
			reject(UnschedulableAndUnresolvable, reasonUnschedulable)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			checkStatus(t, "NodeUnschedulable", filterOne(t, nodeUnschedulable{}, tc.pod, nodeInfoOf(tc.node)), tc.want)
		})
	}
}

func TestNodeNameFilter(t *testing.T) {
	tests := []struct {
		name     string
		nodeName string
		node     string
		want     want
	}{
		{"no nodeName: any node", "", "n1", pass},
		{"nodeName matches", "n1", "n1", pass},
		{"nodeName differs", "n2", "n1", reject(UnschedulableAndUnresolvable, reasonNodeName)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pod := makePod("p", "", "", nil)
			pod.Spec.NodeName = tc.nodeName
			checkStatus(t, "NodeName", filterOne(t, nodeName{}, pod, nodeInfoOf(stdNode(tc.node, nil))), tc.want)
		})
	}
}

// ---------------------------------------------------------------------------------------------------------
// TaintToleration.
// ---------------------------------------------------------------------------------------------------------

func taint(key, value string, effect corev1.TaintEffect) corev1.Taint {
	return corev1.Taint{Key: key, Value: value, Effect: effect}
}

func taintReason(key, value string) string {
	return fmt.Sprintf("node(s) had untolerated taint {%s: %s}", key, value)
}

func TestTaintTolerationFilter(t *testing.T) {
	// The tolerations the DefaultTolerationSeconds admission plugin adds to every pod.
	defaultTolerations := []corev1.Toleration{
		{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptrInt64(300)},
		{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptrInt64(300)},
	}
	tests := []struct {
		name        string
		taints      []corev1.Taint
		tolerations []corev1.Toleration
		want        want
	}{
		{"no taints", nil, nil, pass},
		{"NoSchedule taint without toleration",
			[]corev1.Taint{taint("dedicated", "gpu", corev1.TaintEffectNoSchedule)}, nil,
			reject(UnschedulableAndUnresolvable, taintReason("dedicated", "gpu"))},
		{"NoExecute taint without toleration",
			[]corev1.Taint{taint("dedicated", "gpu", corev1.TaintEffectNoExecute)}, nil,
			reject(UnschedulableAndUnresolvable, taintReason("dedicated", "gpu"))},
		{"Equal toleration with matching key, value and effect",
			[]corev1.Taint{taint("dedicated", "gpu", corev1.TaintEffectNoSchedule)},
			[]corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "gpu", Effect: corev1.TaintEffectNoSchedule}},
			pass},
		{"default operator is Equal",
			[]corev1.Taint{taint("dedicated", "gpu", corev1.TaintEffectNoSchedule)},
			[]corev1.Toleration{{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule}},
			pass},
		{"Equal toleration with another value",
			[]corev1.Taint{taint("dedicated", "gpu", corev1.TaintEffectNoSchedule)},
			[]corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "cpu", Effect: corev1.TaintEffectNoSchedule}},
			reject(UnschedulableAndUnresolvable, taintReason("dedicated", "gpu"))},
		{"Exists toleration on the key, any value",
			[]corev1.Taint{taint("dedicated", "gpu", corev1.TaintEffectNoSchedule)},
			[]corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			pass},
		{"toleration with empty effect matches every effect",
			[]corev1.Taint{taint("dedicated", "gpu", corev1.TaintEffectNoExecute)},
			[]corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}},
			pass},
		{"toleration for NoSchedule does not tolerate NoExecute",
			[]corev1.Taint{taint("dedicated", "gpu", corev1.TaintEffectNoExecute)},
			[]corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			reject(UnschedulableAndUnresolvable, taintReason("dedicated", "gpu"))},
		{"empty key with Exists tolerates every taint",
			[]corev1.Taint{
				taint("dedicated", "gpu", corev1.TaintEffectNoSchedule),
				taint("other", "x", corev1.TaintEffectNoExecute),
				taint(corev1.TaintNodeNotReady, "", corev1.TaintEffectNoSchedule),
			},
			[]corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			pass},
		{"PreferNoSchedule taints do not filter",
			[]corev1.Taint{taint("dedicated", "gpu", corev1.TaintEffectPreferNoSchedule)}, nil,
			pass},
		{"the untolerated one of two taints is reported",
			[]corev1.Taint{
				taint("dedicated", "gpu", corev1.TaintEffectNoSchedule),
				taint("team", "infra", corev1.TaintEffectNoSchedule),
			},
			[]corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}},
			reject(UnschedulableAndUnresolvable, taintReason("team", "infra"))},
		{"not-ready NoSchedule taint rejects a pod without tolerations",
			[]corev1.Taint{taint(corev1.TaintNodeNotReady, "", corev1.TaintEffectNoSchedule)}, nil,
			reject(UnschedulableAndUnresolvable, taintReason("node.kubernetes.io/not-ready", ""))},
		{"unreachable NoSchedule taint rejects a pod without tolerations",
			[]corev1.Taint{taint(corev1.TaintNodeUnreachable, "", corev1.TaintEffectNoSchedule)}, nil,
			reject(UnschedulableAndUnresolvable, taintReason("node.kubernetes.io/unreachable", ""))},
		{"unreachable NoExecute taint rejects a pod without tolerations",
			[]corev1.Taint{taint(corev1.TaintNodeUnreachable, "", corev1.TaintEffectNoExecute)}, nil,
			reject(UnschedulableAndUnresolvable, taintReason("node.kubernetes.io/unreachable", ""))},
		{"not-ready NoSchedule taint rejects a pod with only the default NoExecute tolerations",
			[]corev1.Taint{
				taint(corev1.TaintNodeNotReady, "", corev1.TaintEffectNoExecute),
				taint(corev1.TaintNodeNotReady, "", corev1.TaintEffectNoSchedule),
			},
			defaultTolerations,
			reject(UnschedulableAndUnresolvable, taintReason("node.kubernetes.io/not-ready", ""))},
		{"not-ready NoSchedule taint tolerated explicitly",
			[]corev1.Taint{taint(corev1.TaintNodeNotReady, "", corev1.TaintEffectNoSchedule)},
			[]corev1.Toleration{{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			pass},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pod := with(makePod("p", "", "", nil), tolerating(tc.tolerations...))
			node := nodeInfoOf(stdNode("n1", nil, tc.taints...))
			checkStatus(t, "TaintToleration", filterOne(t, taintToleration{}, pod, node), tc.want)
		})
	}
}

func ptrInt64(v int64) *int64 { return &v }

func TestTaintTolerationScore(t *testing.T) {
	prefer := func(key string) corev1.Taint { return taint(key, "v", corev1.TaintEffectPreferNoSchedule) }
	nodes := []*NodeInfo{
		nodeInfoOf(stdNode("clean", nil)),
		nodeInfoOf(stdNode("one", nil, prefer("a"))),
		nodeInfoOf(stdNode("two", nil, prefer("a"), prefer("b"))),
		// NoSchedule taints do not count in the score.
		nodeInfoOf(stdNode("hard", nil, taint("a", "v", corev1.TaintEffectNoSchedule))),
	}
	tests := []struct {
		name        string
		tolerations []corev1.Toleration
		want        map[string]int64
	}{
		{"no tolerations: fewer PreferNoSchedule taints score higher", nil,
			map[string]int64{"clean": 100, "one": 50, "two": 0, "hard": 100}},
		{"a PreferNoSchedule toleration removes a taint from the count",
			[]corev1.Toleration{{Key: "a", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectPreferNoSchedule}},
			map[string]int64{"clean": 100, "one": 100, "two": 0, "hard": 100}},
		{"a toleration with empty effect counts too",
			[]corev1.Toleration{{Key: "b", Operator: corev1.TolerationOpExists}},
			map[string]int64{"clean": 100, "one": 0, "two": 0, "hard": 100}},
		{"a NoSchedule toleration does not tolerate PreferNoSchedule",
			[]corev1.Toleration{{Key: "a", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			map[string]int64{"clean": 100, "one": 50, "two": 0, "hard": 100}},
		{"everything tolerated: all nodes score the maximum",
			[]corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			map[string]int64{"clean": 100, "one": 100, "two": 100, "hard": 100}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pod := with(makePod("p", "", "", nil), tolerating(tc.tolerations...))
			got := scoreAll(t, taintToleration{}, pod, nodes, nodes, nil)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("scores = %v, want %v", got, tc.want)
			}
		})
	}
}

// ---------------------------------------------------------------------------------------------------------
// NodeAffinity.
// ---------------------------------------------------------------------------------------------------------

func TestNodeAffinityFilter(t *testing.T) {
	node := stdNode("node-1", map[string]string{zoneKey: "a", "disk": "ssd", "cores": "8"})
	In, NotIn, Exists, DoesNotExist, Gt, Lt := corev1.NodeSelectorOpIn, corev1.NodeSelectorOpNotIn,
		corev1.NodeSelectorOpExists, corev1.NodeSelectorOpDoesNotExist, corev1.NodeSelectorOpGt, corev1.NodeSelectorOpLt
	fail := reject(UnschedulableAndUnresolvable, reasonNodeAffinity)
	tests := []struct {
		name string
		pod  *corev1.Pod
		want want
	}{
		{"no constraints", makePod("p", "", "", nil), pass},
		{"nodeSelector matches", with(makePod("p", "", "", nil), withNodeSelector(map[string]string{"disk": "ssd"})), pass},
		{"nodeSelector differs", with(makePod("p", "", "", nil), withNodeSelector(map[string]string{"disk": "hdd"})), fail},
		{"nodeSelector key missing", with(makePod("p", "", "", nil), withNodeSelector(map[string]string{"gpu": "true"})), fail},
		{"In matches", with(makePod("p", "", "", nil), requiredNodeAffinity(exprTerm(expr(zoneKey, In, "b", "a")))), pass},
		{"In does not match", with(makePod("p", "", "", nil), requiredNodeAffinity(exprTerm(expr(zoneKey, In, "b", "c")))), fail},
		{"NotIn passes", with(makePod("p", "", "", nil), requiredNodeAffinity(exprTerm(expr(zoneKey, NotIn, "b")))), pass},
		{"NotIn fails", with(makePod("p", "", "", nil), requiredNodeAffinity(exprTerm(expr(zoneKey, NotIn, "a")))), fail},
		{"NotIn passes on a missing key", with(makePod("p", "", "", nil), requiredNodeAffinity(exprTerm(expr("gpu", NotIn, "x")))), pass},
		{"Exists passes", with(makePod("p", "", "", nil), requiredNodeAffinity(exprTerm(expr("disk", Exists)))), pass},
		{"Exists fails", with(makePod("p", "", "", nil), requiredNodeAffinity(exprTerm(expr("gpu", Exists)))), fail},
		{"DoesNotExist passes", with(makePod("p", "", "", nil), requiredNodeAffinity(exprTerm(expr("gpu", DoesNotExist)))), pass},
		{"DoesNotExist fails", with(makePod("p", "", "", nil), requiredNodeAffinity(exprTerm(expr("disk", DoesNotExist)))), fail},
		{"Gt passes", with(makePod("p", "", "", nil), requiredNodeAffinity(exprTerm(expr("cores", Gt, "4")))), pass},
		{"Gt fails on equal", with(makePod("p", "", "", nil), requiredNodeAffinity(exprTerm(expr("cores", Gt, "8")))), fail},
		{"Lt passes", with(makePod("p", "", "", nil), requiredNodeAffinity(exprTerm(expr("cores", Lt, "16")))), pass},
		{"Lt fails on equal", with(makePod("p", "", "", nil), requiredNodeAffinity(exprTerm(expr("cores", Lt, "8")))), fail},
		{"Gt on a non-integer label fails", with(makePod("p", "", "", nil), requiredNodeAffinity(exprTerm(expr("disk", Gt, "1")))), fail},
		{"matchFields metadata.name matches", with(makePod("p", "", "", nil), requiredNodeAffinity(corev1.NodeSelectorTerm{
			MatchFields: []corev1.NodeSelectorRequirement{expr("metadata.name", In, "node-1")}})), pass},
		{"matchFields metadata.name differs", with(makePod("p", "", "", nil), requiredNodeAffinity(corev1.NodeSelectorTerm{
			MatchFields: []corev1.NodeSelectorRequirement{expr("metadata.name", In, "node-2")}})), fail},
		{"expressions are ANDed: one fails", with(makePod("p", "", "", nil), requiredNodeAffinity(exprTerm(
			expr(zoneKey, In, "a"), expr("disk", In, "hdd")))), fail},
		{"expressions are ANDed: all pass", with(makePod("p", "", "", nil), requiredNodeAffinity(exprTerm(
			expr(zoneKey, In, "a"), expr("disk", In, "ssd"), expr("cores", Gt, "2")))), pass},
		{"matchExpressions and matchFields in one term are ANDed", with(makePod("p", "", "", nil), requiredNodeAffinity(corev1.NodeSelectorTerm{
			MatchExpressions: []corev1.NodeSelectorRequirement{expr(zoneKey, In, "a")},
			MatchFields:      []corev1.NodeSelectorRequirement{expr("metadata.name", In, "node-2")}})), fail},
		{"terms are ORed: second term passes", with(makePod("p", "", "", nil), requiredNodeAffinity(
			exprTerm(expr(zoneKey, In, "b")), exprTerm(expr("disk", In, "ssd")))), pass},
		{"terms are ORed: no term passes", with(makePod("p", "", "", nil), requiredNodeAffinity(
			exprTerm(expr(zoneKey, In, "b")), exprTerm(expr("disk", In, "hdd")))), fail},
		{"nodeSelector and affinity both apply: affinity fails", with(makePod("p", "", "", nil),
			withNodeSelector(map[string]string{"disk": "ssd"}), requiredNodeAffinity(exprTerm(expr(zoneKey, In, "b")))), fail},
		{"nodeSelector and affinity both apply: selector fails", with(makePod("p", "", "", nil),
			withNodeSelector(map[string]string{"disk": "hdd"}), requiredNodeAffinity(exprTerm(expr(zoneKey, In, "a")))), fail},
		{"nodeSelector and affinity both pass", with(makePod("p", "", "", nil),
			withNodeSelector(map[string]string{"disk": "ssd"}), requiredNodeAffinity(exprTerm(expr(zoneKey, In, "a")))), pass},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			checkStatus(t, "NodeAffinity", filterOne(t, nodeAffinity{}, tc.pod, nodeInfoOf(node)), tc.want)
		})
	}
}

func TestNodeAffinityScore(t *testing.T) {
	nodes := []*NodeInfo{
		nodeInfoOf(stdNode("a-ssd", map[string]string{zoneKey: "a", "disk": "ssd"})),
		nodeInfoOf(stdNode("a-hdd", map[string]string{zoneKey: "a", "disk": "hdd"})),
		nodeInfoOf(stdNode("b-ssd", map[string]string{zoneKey: "b", "disk": "ssd"})),
		nodeInfoOf(stdNode("b-hdd", map[string]string{zoneKey: "b", "disk": "hdd"})),
	}
	pref := func(w int32, key, value string) corev1.PreferredSchedulingTerm {
		return corev1.PreferredSchedulingTerm{Weight: w, Preference: exprTerm(expr(key, corev1.NodeSelectorOpIn, value))}
	}
	tests := []struct {
		name string
		pod  *corev1.Pod
		want map[string]int64
	}{
		{"no preferences: all zero", makePod("p", "", "", nil),
			map[string]int64{"a-ssd": 0, "a-hdd": 0, "b-ssd": 0, "b-hdd": 0}},
		{"weights add up, highest sum normalized to 100",
			with(makePod("p", "", "", nil), preferredNodeAffinity(pref(30, zoneKey, "a"), pref(10, "disk", "ssd"))),
			map[string]int64{"a-ssd": 100, "a-hdd": 75, "b-ssd": 25, "b-hdd": 0}},
		{"one preference", with(makePod("p", "", "", nil), preferredNodeAffinity(pref(5, "disk", "hdd"))),
			map[string]int64{"a-ssd": 0, "a-hdd": 100, "b-ssd": 0, "b-hdd": 100}},
		{"a preference no node meets", with(makePod("p", "", "", nil), preferredNodeAffinity(pref(50, zoneKey, "z"))),
			map[string]int64{"a-ssd": 0, "a-hdd": 0, "b-ssd": 0, "b-hdd": 0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := scoreAll(t, nodeAffinity{}, tc.pod, nodes, nodes, nil)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("scores = %v, want %v", got, tc.want)
			}
		})
	}
}

// ---------------------------------------------------------------------------------------------------------
// NodeResourcesFit, LeastAllocated and BalancedAllocation.
// ---------------------------------------------------------------------------------------------------------

func TestNodeResourcesFitFilter(t *testing.T) {
	// 2 cpu, 4Gi, 3 pods, 50Gi ephemeral storage, 2 GPUs.
	gpuNode := func() *corev1.Node {
		n := makeNode("n1", "2", "4Gi", "3", nil)
		n.Status.Allocatable[gpu] = resource.MustParse("2")
		return n
	}
	tests := []struct {
		name     string
		pod      *corev1.Pod
		node     *corev1.Node
		existing []*corev1.Pod
		want     want
	}{
		{"fits", makePod("p", "1", "1Gi", nil), gpuNode(), nil, pass},
		{"fits exactly", makePod("p", "2", "4Gi", nil), gpuNode(), nil, pass},
		{"no requests fit", makePod("p", "", "", nil), gpuNode(), nil, pass},
		{"too much cpu", makePod("p", "3", "1Gi", nil), gpuNode(), nil, reject(Unschedulable, reasonInsufficientCPU)},
		{"too much memory", makePod("p", "1", "5Gi", nil), gpuNode(), nil, reject(Unschedulable, reasonInsufficientMem)},
		{"cpu and memory at once", makePod("p", "2500m", "5Gi", nil), gpuNode(), nil,
			reject(Unschedulable, reasonInsufficientCPU, reasonInsufficientMem)},
		{"too much ephemeral storage", with(makePod("p", "", "", nil), withRequests(rl("ephemeral-storage", "60Gi"))), gpuNode(), nil,
			reject(Unschedulable, "Insufficient ephemeral-storage")},
		{"extended resource fits", with(makePod("p", "", "", nil), withRequests(rl("example.com/gpu", "2"))), gpuNode(), nil, pass},
		{"extended resource exceeds", with(makePod("p", "", "", nil), withRequests(rl("example.com/gpu", "3"))), gpuNode(), nil,
			reject(Unschedulable, "Insufficient example.com/gpu")},
		{"extended resource the node lacks", with(makePod("p", "", "", nil), withRequests(rl("example.com/gpu", "1"))),
			makeNode("n1", "2", "4Gi", "3", nil), nil, reject(Unschedulable, "Insufficient example.com/gpu")},
		{"extended resource taken by an existing pod", with(makePod("p", "", "", nil), withRequests(rl("example.com/gpu", "1"))), gpuNode(),
			[]*corev1.Pod{with(makePod("e1", "", "", nil), withRequests(rl("example.com/gpu", "2")))},
			reject(Unschedulable, "Insufficient example.com/gpu")},
		{"pod slots full", makePod("p", "", "", nil), gpuNode(),
			[]*corev1.Pod{makePod("e1", "", "", nil), makePod("e2", "", "", nil), makePod("e3", "", "", nil)},
			reject(Unschedulable, "Too many pods")},
		{"last pod slot free", makePod("p", "", "", nil), gpuNode(),
			[]*corev1.Pod{makePod("e1", "", "", nil), makePod("e2", "", "", nil)}, pass},
		{"pod slots and cpu at once", makePod("p", "1500m", "", nil), gpuNode(),
			[]*corev1.Pod{makePod("e1", "1", "", nil), makePod("e2", "", "", nil), makePod("e3", "", "", nil)},
			reject(Unschedulable, "Too many pods", reasonInsufficientCPU)},
		{"node without a pods allocatable allows none", makePod("p", "", "", nil), makeNode("n1", "2", "4Gi", "", nil), nil,
			reject(Unschedulable, "Too many pods")},
		{"init container larger than the app containers", with(makePod("p", "1", "", nil), withInit("init", rl("cpu", "3"), false)),
			gpuNode(), nil, reject(Unschedulable, reasonInsufficientCPU)},
		{"init container counts as the max, not the sum", with(makePod("p", "500m", "", nil), withContainer("second", rl("cpu", "500m")),
			withInit("init", rl("cpu", "2"), false)), gpuNode(), nil, pass},
		{"app containers sum", with(makePod("p", "1500m", "", nil), withContainer("second", rl("cpu", "1"))), gpuNode(), nil,
			reject(Unschedulable, reasonInsufficientCPU)},
		{"sidecar (restartable init container) adds to the app containers",
			with(makePod("p", "1500m", "", nil), withInit("sidecar", rl("cpu", "1"), true)), gpuNode(), nil,
			reject(Unschedulable, reasonInsufficientCPU)},
		{"overhead is added", with(makePod("p", "1500m", "", nil), withOverhead(rl("cpu", "1"))), gpuNode(), nil,
			reject(Unschedulable, reasonInsufficientCPU)},
		{"overhead fits exactly", with(makePod("p", "1500m", "", nil), withOverhead(rl("cpu", "500m"))), gpuNode(), nil, pass},
		{"existing pods leave too little cpu", makePod("p", "1", "", nil), gpuNode(),
			[]*corev1.Pod{makePod("e1", "1500m", "", nil)}, reject(Unschedulable, reasonInsufficientCPU)},
		{"existing pods leave just enough", makePod("p", "1", "2Gi", nil), gpuNode(),
			[]*corev1.Pod{makePod("e1", "1", "2Gi", nil)}, pass},
		{"existing pod counts by the init-container max rule", makePod("p", "1", "", nil), gpuNode(),
			[]*corev1.Pod{with(makePod("e1", "500m", "", nil), withInit("init", rl("cpu", "1"), false))}, pass},
		{"existing pods' memory", makePod("p", "", "3Gi", nil), gpuNode(),
			[]*corev1.Pod{makePod("e1", "", "1500Mi", nil)}, reject(Unschedulable, reasonInsufficientMem)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := nodeInfoOf(tc.node, tc.existing...)
			checkStatus(t, "NodeResourcesFit", filterOne(t, nodeResourcesFit{}, tc.pod, n), tc.want)
		})
	}
}

func TestLeastAllocatedScore(t *testing.T) {
	tests := []struct {
		name  string
		pod   *corev1.Pod
		nodes []*NodeInfo
		want  map[string]int64
	}{
		{"emptier node scores higher", makePod("p", "1", "2Gi", nil), []*NodeInfo{
			nodeInfoOf(makeNode("empty", "4", "8Gi", "110", nil)),
			nodeInfoOf(makeNode("half", "4", "8Gi", "110", nil), makePod("e1", "2", "4Gi", nil)),
		}, map[string]int64{"empty": 75, "half": 25}},
		{"requests unset count as 100m and 200Mi", makePod("p", "", "", nil), []*NodeInfo{
			nodeInfoOf(makeNode("n1", "1", "1000Mi", "110", nil)),
		}, map[string]int64{"n1": 85}},
		{"existing pods without requests count too", makePod("p", "", "", nil), []*NodeInfo{
			nodeInfoOf(makeNode("n1", "1", "1000Mi", "110", nil), makePod("e1", "", "", nil)),
		}, map[string]int64{"n1": 70}},
		{"overcommitted resource scores 0", makePod("p", "2", "1Gi", nil), []*NodeInfo{
			nodeInfoOf(makeNode("n1", "1", "4Gi", "110", nil)),
		}, map[string]int64{"n1": 37}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := scoreAll(t, nodeResourcesFit{}, tc.pod, tc.nodes, tc.nodes, nil)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("scores = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestBalancedAllocationScore(t *testing.T) {
	tests := []struct {
		name  string
		pod   *corev1.Pod
		nodes []*NodeInfo
		want  map[string]int64
	}{
		{"balanced node scores higher", makePod("p", "1", "2Gi", nil), []*NodeInfo{
			nodeInfoOf(makeNode("balanced", "4", "8Gi", "110", nil)),
			nodeInfoOf(makeNode("memory-heavy", "4", "8Gi", "110", nil), makePod("e1", "1", "6Gi", nil)),
		}, map[string]int64{"balanced": 100, "memory-heavy": 75}},
		{"cpu-heavy pod on an empty node", makePod("p", "2", "1Gi", nil), []*NodeInfo{
			nodeInfoOf(makeNode("n1", "4", "8Gi", "110", nil)),
		}, map[string]int64{"n1": 81}},
		{"shares are capped at 1", makePod("p", "8", "8Gi", nil), []*NodeInfo{
			nodeInfoOf(makeNode("n1", "4", "8Gi", "110", nil)),
		}, map[string]int64{"n1": 100}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := scoreAll(t, balancedAllocation{}, tc.pod, tc.nodes, tc.nodes, nil)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("scores = %v, want %v", got, tc.want)
			}
		})
	}
}

// ---------------------------------------------------------------------------------------------------------
// NodePorts.
// ---------------------------------------------------------------------------------------------------------

func TestNodePortsFilter(t *testing.T) {
	port := func(hostIP string, proto corev1.Protocol, hostPort int32) corev1.ContainerPort {
		return corev1.ContainerPort{ContainerPort: 80, HostIP: hostIP, Protocol: proto, HostPort: hostPort}
	}
	conflict := reject(Unschedulable, reasonPorts)
	tests := []struct {
		name     string
		existing []corev1.ContainerPort
		want     []corev1.ContainerPort
		result   want
	}{
		{"no ports requested", []corev1.ContainerPort{port("", "", 8080)}, nil, pass},
		{"container port only, no host port", []corev1.ContainerPort{port("", "", 8080)}, []corev1.ContainerPort{{ContainerPort: 8080}}, pass},
		{"same port and protocol", []corev1.ContainerPort{port("", corev1.ProtocolTCP, 8080)}, []corev1.ContainerPort{port("", corev1.ProtocolTCP, 8080)}, conflict},
		{"empty protocol defaults to TCP", []corev1.ContainerPort{port("", "", 8080)}, []corev1.ContainerPort{port("", corev1.ProtocolTCP, 8080)}, conflict},
		{"different protocol", []corev1.ContainerPort{port("", corev1.ProtocolTCP, 8080)}, []corev1.ContainerPort{port("", corev1.ProtocolUDP, 8080)}, pass},
		{"different port", []corev1.ContainerPort{port("", corev1.ProtocolTCP, 8080)}, []corev1.ContainerPort{port("", corev1.ProtocolTCP, 8081)}, pass},
		{"existing on 0.0.0.0, wanted on a specific IP", []corev1.ContainerPort{port("0.0.0.0", "", 8080)}, []corev1.ContainerPort{port("10.0.0.1", "", 8080)}, conflict},
		{"existing on a specific IP, wanted on all (empty host IP)", []corev1.ContainerPort{port("10.0.0.1", "", 8080)}, []corev1.ContainerPort{port("", "", 8080)}, conflict},
		{"same specific IP", []corev1.ContainerPort{port("10.0.0.1", "", 8080)}, []corev1.ContainerPort{port("10.0.0.1", "", 8080)}, conflict},
		{"different specific IPs", []corev1.ContainerPort{port("10.0.0.1", "", 8080)}, []corev1.ContainerPort{port("10.0.0.2", "", 8080)}, pass},
		{"one of several ports conflicts", []corev1.ContainerPort{port("", "", 8080)},
			[]corev1.ContainerPort{port("", "", 9090), port("", corev1.ProtocolUDP, 53), port("", "", 8080)}, conflict},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			existing := with(makePod("e1", "", "", nil), withHostPorts(tc.existing...))
			pod := with(makePod("p", "", "", nil), withHostPorts(tc.want...))
			n := nodeInfoOf(stdNode("n1", nil), existing)
			checkStatus(t, "NodePorts", filterOne(t, nodePorts{}, pod, n), tc.result)
		})
	}

	t.Run("port frees when the pod leaves", func(t *testing.T) {
		existing := with(makePod("e1", "", "", nil), withHostPorts(port("", "", 8080)))
		pod := with(makePod("p", "", "", nil), withHostPorts(port("", "", 8080)))
		n := nodeInfoOf(stdNode("n1", nil), existing)
		checkStatus(t, "before removal", filterOne(t, nodePorts{}, pod, n), conflict)
		if !n.removePod(existing.UID) {
			t.Fatal("removePod returned false")
		}
		checkStatus(t, "after removal", filterOne(t, nodePorts{}, pod, n), pass)
	})
}

// ---------------------------------------------------------------------------------------------------------
// InterPodAffinity.
// ---------------------------------------------------------------------------------------------------------

// ipaNodes is the cluster for the inter-pod affinity tests: n1 and n2 in zone a, n3 in zone b, n4 without a
// zone label.
func ipaNodes(existing map[string][]*corev1.Pod) []*NodeInfo {
	nodes := []*corev1.Node{
		stdNode("n1", map[string]string{zoneKey: "a"}),
		stdNode("n2", map[string]string{zoneKey: "a"}),
		stdNode("n3", map[string]string{zoneKey: "b"}),
		stdNode("n4", nil),
	}
	var out []*NodeInfo
	for _, n := range nodes {
		out = append(out, nodeInfoOf(n, existing[n.Name]...))
	}
	return out
}

func TestInterPodAffinityFilter(t *testing.T) {
	app := func(v string) map[string]string { return map[string]string{"app": v} }
	noAff := reject(UnschedulableAndUnresolvable, reasonPodAffinity)
	anti := reject(Unschedulable, reasonPodAnti)
	existingAnti := reject(Unschedulable, reasonExistingAnti)
	tests := []struct {
		name     string
		pod      *corev1.Pod
		existing map[string][]*corev1.Pod
		nsLabels map[string]labels.Set
		want     map[string]want
	}{
		{
			name: "no terms: every node passes",
			pod:  makePod("p", "", "", app("web")),
			existing: map[string][]*corev1.Pod{
				"n1": {makePod("db", "", "", app("db"))},
			},
			want: map[string]want{"n1": pass, "n2": pass, "n3": pass, "n4": pass},
		},
		{
			name: "required affinity to a pod in the same zone",
			pod:  with(makePod("p", "", "", app("web")), requiredPodAffinity(podTerm(zoneKey, app("db")))),
			existing: map[string][]*corev1.Pod{
				"n1": {makePod("db", "", "", app("db"))},
			},
			want: map[string]want{"n1": pass, "n2": pass, "n3": noAff, "n4": noAff},
		},
		{
			name: "required affinity, no matching pod anywhere, pod does not select itself",
			pod:  with(makePod("p", "", "", app("web")), requiredPodAffinity(podTerm(zoneKey, app("db")))),
			existing: map[string][]*corev1.Pod{
				"n1": {makePod("cache", "", "", app("cache"))},
			},
			want: map[string]want{"n1": noAff, "n2": noAff, "n3": noAff, "n4": noAff},
		},
		{
			name: "first pod of a self-selecting group goes wherever the topology key exists",
			pod:  with(makePod("p", "", "", app("web")), requiredPodAffinity(podTerm(zoneKey, app("web")))),
			existing: map[string][]*corev1.Pod{
				"n1": {makePod("cache", "", "", app("cache"))},
			},
			want: map[string]want{"n1": pass, "n2": pass, "n3": pass, "n4": noAff},
		},
		{
			name: "self-selecting group with a member already: only its domain",
			pod:  with(makePod("p", "", "", app("web")), requiredPodAffinity(podTerm(zoneKey, app("web")))),
			existing: map[string][]*corev1.Pod{
				"n3": {makePod("web-0", "", "", app("web"))},
			},
			want: map[string]want{"n1": noAff, "n2": noAff, "n3": pass, "n4": noAff},
		},
		{
			// Kubernetes counts a matching pod in the domain of each term whose key its node has: the pod on
			// n4 (no zone) still counts for the hostname term, so the group is not "first" any more.
			name: "two self-selecting terms, the only member on a node without one term's key",
			pod:  with(makePod("p", "", "", app("web")), requiredPodAffinity(podTerm(zoneKey, app("web")), podTerm(hostKey, app("web")))),
			existing: map[string][]*corev1.Pod{
				"n4": {makePod("web-0", "", "", app("web"))},
			},
			want: map[string]want{"n1": noAff, "n2": noAff, "n3": noAff, "n4": noAff},
		},
		{
			name: "two affinity terms: both must be met by one pod",
			pod: with(makePod("p", "", "", app("web")), requiredPodAffinity(
				podTerm(zoneKey, app("db")), podTerm(hostKey, map[string]string{"tier": "data"}))),
			existing: map[string][]*corev1.Pod{
				"n1": {makePod("db-1", "", "", map[string]string{"app": "db", "tier": "data"})},
				"n3": {makePod("db-2", "", "", app("db"))},
			},
			want: map[string]want{"n1": pass, "n2": noAff, "n3": noAff, "n4": noAff},
		},
		{
			name: "required anti-affinity across hostname",
			pod:  with(makePod("p", "", "", app("web")), requiredPodAnti(podTerm(hostKey, app("web")))),
			existing: map[string][]*corev1.Pod{
				"n1": {makePod("web-0", "", "", app("web"))},
			},
			want: map[string]want{"n1": anti, "n2": pass, "n3": pass, "n4": pass},
		},
		{
			name: "required anti-affinity across zone",
			pod:  with(makePod("p", "", "", app("web")), requiredPodAnti(podTerm(zoneKey, app("web")))),
			existing: map[string][]*corev1.Pod{
				"n1": {makePod("web-0", "", "", app("web"))},
			},
			want: map[string]want{"n1": anti, "n2": anti, "n3": pass, "n4": pass},
		},
		{
			name: "symmetry: an existing pod's anti-affinity keeps the new pod out of its zone",
			pod:  makePod("p", "", "", app("web")),
			existing: map[string][]*corev1.Pod{
				"n1": {with(makePod("loner", "", "", app("loner")), requiredPodAnti(podTerm(zoneKey, app("web"))))},
			},
			want: map[string]want{"n1": existingAnti, "n2": existingAnti, "n3": pass, "n4": pass},
		},
		{
			name: "symmetry: an existing pod's anti-affinity across hostname",
			pod:  makePod("p", "", "", app("web")),
			existing: map[string][]*corev1.Pod{
				"n3": {with(makePod("loner", "", "", app("loner")), requiredPodAnti(podTerm(hostKey, app("web"))))},
			},
			want: map[string]want{"n1": pass, "n2": pass, "n3": existingAnti, "n4": pass},
		},
		{
			name: "symmetry: an anti-affinity that does not select the new pod",
			pod:  makePod("p", "", "", app("web")),
			existing: map[string][]*corev1.Pod{
				"n1": {with(makePod("loner", "", "", app("loner")), requiredPodAnti(podTerm(zoneKey, app("db"))))},
			},
			want: map[string]want{"n1": pass, "n2": pass, "n3": pass, "n4": pass},
		},
		{
			name: "symmetry: an existing pod's anti-affinity in another namespace only selects its own namespace",
			pod:  makePod("p", "", "", app("web")),
			existing: map[string][]*corev1.Pod{
				"n1": {with(makePod("loner", "", "", app("loner")), inNamespace("other"), requiredPodAnti(podTerm(zoneKey, app("web"))))},
			},
			want: map[string]want{"n1": pass, "n2": pass, "n3": pass, "n4": pass},
		},
		{
			name: "namespaces: a term without namespaces ignores pods of other namespaces",
			pod:  with(makePod("p", "", "", app("web")), requiredPodAffinity(podTerm(zoneKey, app("db")))),
			existing: map[string][]*corev1.Pod{
				"n1": {with(makePod("db", "", "", app("db")), inNamespace("other"))},
			},
			want: map[string]want{"n1": noAff, "n2": noAff, "n3": noAff, "n4": noAff},
		},
		{
			name: "namespaces: a term naming the other namespace matches",
			pod:  with(makePod("p", "", "", app("web")), requiredPodAffinity(podTerm(zoneKey, app("db"), "other"))),
			existing: map[string][]*corev1.Pod{
				"n1": {with(makePod("db", "", "", app("db")), inNamespace("other"))},
				"n3": {makePod("db-default", "", "", app("db"))},
			},
			want: map[string]want{"n1": pass, "n2": pass, "n3": noAff, "n4": noAff},
		},
		{
			name: "namespaces: anti-affinity without namespaces ignores other namespaces",
			pod:  with(makePod("p", "", "", app("web")), requiredPodAnti(podTerm(hostKey, app("web")))),
			existing: map[string][]*corev1.Pod{
				"n1": {with(makePod("web-0", "", "", app("web")), inNamespace("other"))},
			},
			want: map[string]want{"n1": pass, "n2": pass, "n3": pass, "n4": pass},
		},
		{
			name: "namespaces: a namespace selector matches by namespace labels",
			pod: with(makePod("p", "", "", app("web")), requiredPodAffinity(corev1.PodAffinityTerm{
				LabelSelector:     &metav1.LabelSelector{MatchLabels: app("db")},
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "data"}},
				TopologyKey:       zoneKey,
			})),
			existing: map[string][]*corev1.Pod{
				"n1": {with(makePod("db", "", "", app("db")), inNamespace("data"))},
				"n3": {with(makePod("db", "", "", app("db")), inNamespace("scratch"))},
			},
			nsLabels: map[string]labels.Set{"data": {"team": "data"}, "scratch": {"team": "scratch"}},
			want:     map[string]want{"n1": pass, "n2": pass, "n3": noAff, "n4": noAff},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			nodes := ipaNodes(tc.existing)
			got := filterAll(t, interPodAffinity{}, tc.pod, nodes, tc.nsLabels)
			for _, n := range nodes {
				checkStatus(t, n.Name(), got[n.Name()], tc.want[n.Name()])
			}
		})
	}
}

func TestInterPodAffinityScore(t *testing.T) {
	app := func(v string) map[string]string { return map[string]string{"app": v} }
	tests := []struct {
		name     string
		pod      *corev1.Pod
		existing map[string][]*corev1.Pod
		feasible []string // nil: every node
		want     map[string]int64
	}{
		{
			name:     "no terms anywhere: all zero",
			pod:      makePod("p", "", "", app("web")),
			existing: map[string][]*corev1.Pod{"n1": {makePod("db", "", "", app("db"))}},
			want:     map[string]int64{"n1": 0, "n2": 0, "n3": 0, "n4": 0},
		},
		{
			name:     "preferred affinity: the zone with a matching pod scores higher",
			pod:      with(makePod("p", "", "", app("web")), preferredPodAffinity(10, podTerm(zoneKey, app("db")))),
			existing: map[string][]*corev1.Pod{"n1": {makePod("db", "", "", app("db"))}},
			want:     map[string]int64{"n1": 100, "n2": 100, "n3": 0, "n4": 0},
		},
		{
			name:     "preferred anti-affinity: the zone with a matching pod scores lower",
			pod:      with(makePod("p", "", "", app("web")), preferredPodAnti(10, podTerm(zoneKey, app("web")))),
			existing: map[string][]*corev1.Pod{"n1": {makePod("web-0", "", "", app("web"))}},
			want:     map[string]int64{"n1": 0, "n2": 0, "n3": 100, "n4": 100},
		},
		{
			name: "affinity and anti-affinity weights combine",
			pod: with(makePod("p", "", "", app("web")),
				preferredPodAffinity(10, podTerm(zoneKey, app("db"))),
				preferredPodAnti(5, podTerm(hostKey, app("cache")))),
			existing: map[string][]*corev1.Pod{
				"n1": {makePod("db", "", "", app("db"))},
				"n2": {makePod("cache", "", "", app("cache"))},
			},
			want: map[string]int64{"n1": 100, "n2": 50, "n3": 0, "n4": 0},
		},
		{
			name: "symmetry: an existing pod's preferred affinity attracts the new pod",
			pod:  makePod("p", "", "", app("web")),
			existing: map[string][]*corev1.Pod{
				"n3": {with(makePod("db", "", "", app("db")), preferredPodAffinity(7, podTerm(zoneKey, app("web"))))},
			},
			want: map[string]int64{"n1": 0, "n2": 0, "n3": 100, "n4": 0},
		},
		{
			name: "symmetry: an existing pod's required affinity counts with weight 1",
			pod:  makePod("p", "", "", app("web")),
			existing: map[string][]*corev1.Pod{
				"n1": {with(makePod("db", "", "", app("db")), requiredPodAffinity(podTerm(zoneKey, app("web"))))},
			},
			want: map[string]int64{"n1": 100, "n2": 100, "n3": 0, "n4": 0},
		},
		{
			name: "namespaces: a preferred term without namespaces ignores other namespaces",
			pod:  with(makePod("p", "", "", app("web")), preferredPodAffinity(10, podTerm(zoneKey, app("db")))),
			existing: map[string][]*corev1.Pod{
				"n1": {with(makePod("db", "", "", app("db")), inNamespace("other"))},
			},
			want: map[string]int64{"n1": 0, "n2": 0, "n3": 0, "n4": 0},
		},
		{
			name:     "preferred affinity counts pods on infeasible nodes of the domain",
			pod:      with(makePod("p", "", "", app("web")), preferredPodAffinity(10, podTerm(zoneKey, app("db")))),
			existing: map[string][]*corev1.Pod{"n1": {makePod("db", "", "", app("db"))}},
			feasible: []string{"n2", "n3", "n4"},
			want:     map[string]int64{"n2": 100, "n3": 0, "n4": 0},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			nodes := ipaNodes(tc.existing)
			feasible := nodes
			if tc.feasible != nil {
				feasible = nil
				for _, n := range nodes {
					for _, name := range tc.feasible {
						if n.Name() == name {
							feasible = append(feasible, n)
						}
					}
				}
			}
			got := scoreAll(t, interPodAffinity{}, tc.pod, nodes, feasible, nil)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("scores = %v, want %v", got, tc.want)
			}
		})
	}
}

// ---------------------------------------------------------------------------------------------------------
// PodTopologySpread.
// ---------------------------------------------------------------------------------------------------------

// spreadNodes builds a1 (zone a), b1 (zone b), c1 (zone c) and x1 (no zone label) with the given numbers of
// app=web pods, plus extra pods per node.
func spreadNodes(a, b, c int, extra map[string][]*corev1.Pod) []*NodeInfo {
	webs := func(node string, n int) []*corev1.Pod {
		var pods []*corev1.Pod
		for i := range n {
			pods = append(pods, makePod(fmt.Sprintf("web-%s-%d", node, i), "", "", map[string]string{"app": "web"}))
		}
		return append(pods, extra[node]...)
	}
	return []*NodeInfo{
		nodeInfoOf(stdNode("a1", map[string]string{zoneKey: "a"}), webs("a1", a)...),
		nodeInfoOf(stdNode("b1", map[string]string{zoneKey: "b"}), webs("b1", b)...),
		nodeInfoOf(stdNode("c1", map[string]string{zoneKey: "c"}), webs("c1", c)...),
		nodeInfoOf(stdNode("x1", nil), webs("x1", 0)...),
	}
}

func TestPodTopologySpreadFilter(t *testing.T) {
	web := map[string]string{"app": "web"}
	hard := func(sel map[string]string, minDomains *int32) func(*corev1.Pod) {
		return spreadConstraintOn(zoneKey, 1, corev1.DoNotSchedule, sel, minDomains)
	}
	skewed := reject(Unschedulable, reasonSpread)
	noLabel := reject(UnschedulableAndUnresolvable, reasonSpreadNoLabel)
	tests := []struct {
		name    string
		pod     *corev1.Pod
		a, b, c int
		extra   map[string][]*corev1.Pod
		nodes   func([]*NodeInfo) // changes the nodes a1, b1, c1, x1 before the run
		want    map[string]want
	}{
		{
			name: "2/1/1: zone a would exceed the skew",
			pod:  with(makePod("p", "", "", web), hard(web, nil)),
			a:    2, b: 1, c: 1,
			want: map[string]want{"a1": skewed, "b1": pass, "c1": pass, "x1": noLabel},
		},
		{
			name: "1/1/0: only the empty zone",
			pod:  with(makePod("p", "", "", web), hard(web, nil)),
			a:    1, b: 1, c: 0,
			want: map[string]want{"a1": skewed, "b1": skewed, "c1": pass, "x1": noLabel},
		},
		{
			name: "1/1/1: every zone",
			pod:  with(makePod("p", "", "", web), hard(web, nil)),
			a:    1, b: 1, c: 1,
			want: map[string]want{"a1": pass, "b1": pass, "c1": pass, "x1": noLabel},
		},
		{
			name: "minDomains above the domain count makes the global minimum 0",
			pod:  with(makePod("p", "", "", web), hard(web, int32p(5))),
			a:    1, b: 1, c: 1,
			want: map[string]want{"a1": skewed, "b1": skewed, "c1": skewed, "x1": noLabel},
		},
		{
			name: "minDomains equal to the domain count keeps the real minimum",
			pod:  with(makePod("p", "", "", web), hard(web, int32p(3))),
			a:    1, b: 1, c: 1,
			want: map[string]want{"a1": pass, "b1": pass, "c1": pass, "x1": noLabel},
		},
		{
			name: "a pod its own selector does not match adds no skew",
			pod:  with(makePod("p", "", "", map[string]string{"app": "other"}), hard(web, nil)),
			a:    2, b: 1, c: 1,
			want: map[string]want{"a1": pass, "b1": pass, "c1": pass, "x1": noLabel},
		},
		{
			name: "terminating pods do not count",
			pod:  with(makePod("p", "", "", web), hard(web, nil)),
			a:    1, b: 1, c: 1,
			extra: map[string][]*corev1.Pod{"a1": {with(makePod("dying", "", "", web), terminating())}},
			want:  map[string]want{"a1": pass, "b1": pass, "c1": pass, "x1": noLabel},
		},
		{
			name: "pods of other namespaces do not count",
			pod:  with(makePod("p", "", "", web), hard(web, nil)),
			a:    1, b: 1, c: 1,
			extra: map[string][]*corev1.Pod{"a1": {with(makePod("elsewhere", "", "", web), inNamespace("other"))}},
			want:  map[string]want{"a1": pass, "b1": pass, "c1": pass, "x1": noLabel},
		},
		{
			name: "nodes the pod's node affinity excludes do not count (the empty zone c)",
			pod: with(makePod("p", "", "", web), hard(web, nil),
				requiredNodeAffinity(exprTerm(expr(zoneKey, corev1.NodeSelectorOpIn, "a", "b")))),
			a: 1, b: 1, c: 0,
			want: map[string]want{"a1": pass, "b1": pass},
		},
		{
			name: "nodeAffinityPolicy Ignore counts the nodes the pod's node affinity excludes (the empty zone c)",
			pod: with(makePod("p", "", "", web), hard(web, nil), withSpreadPolicies(corev1.NodeInclusionPolicyIgnore, ""),
				requiredNodeAffinity(exprTerm(expr(zoneKey, corev1.NodeSelectorOpIn, "a", "b")))),
			a: 1, b: 1, c: 0,
			want: map[string]want{"a1": skewed, "b1": skewed},
		},
		{
			name: "nodeTaintsPolicy Honor leaves out a node whose taint the pod does not tolerate (the empty zone c)",
			pod:  with(makePod("p", "", "", web), hard(web, nil), withSpreadPolicies("", corev1.NodeInclusionPolicyHonor)),
			a:    1, b: 1, c: 0,
			nodes: func(ns []*NodeInfo) {
				ns[2].Node.Spec.Taints = []corev1.Taint{{Key: "dedicated", Value: "db", Effect: corev1.TaintEffectNoSchedule}}
			},
			want: map[string]want{"a1": pass, "b1": pass},
		},
		{
			name: "ScheduleAnyway constraints do not filter",
			pod:  with(makePod("p", "", "", web), spreadConstraintOn(zoneKey, 1, corev1.ScheduleAnyway, web, nil)),
			a:    5, b: 0, c: 0,
			want: map[string]want{"a1": pass, "b1": pass, "c1": pass, "x1": pass},
		},
		{
			// Only nodes with every constraint's key count: x1 (no zone) must not add an empty hostname
			// domain, which would lower the hostname minimum to 0 and make every node too skewed.
			name: "two constraints: a node without one of the keys counts for neither",
			pod: with(makePod("p", "", "", web), hard(web, nil),
				spreadConstraintOn(hostKey, 1, corev1.DoNotSchedule, web, nil)),
			a: 1, b: 1, c: 1,
			want: map[string]want{"a1": pass, "b1": pass, "c1": pass, "x1": noLabel},
		},
		{
			name: "maxSkew 2 allows 2/1/1 in zone a",
			pod:  with(makePod("p", "", "", web), spreadConstraintOn(zoneKey, 2, corev1.DoNotSchedule, web, nil)),
			a:    2, b: 1, c: 1,
			want: map[string]want{"a1": pass, "b1": pass, "c1": pass, "x1": noLabel},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			nodes := spreadNodes(tc.a, tc.b, tc.c, tc.extra)
			if tc.nodes != nil {
				tc.nodes(nodes)
			}
			got := filterAll(t, podTopologySpread{}, tc.pod, nodes, nil)
			for name, w := range tc.want {
				checkStatus(t, name, got[name], w)
			}
		})
	}
}

func TestPodTopologySpreadScore(t *testing.T) {
	web := map[string]string{"app": "web"}
	soft := spreadConstraintOn(zoneKey, 1, corev1.ScheduleAnyway, web, nil)
	tests := []struct {
		name    string
		pod     *corev1.Pod
		a, b, c int
		want    map[string]int64
	}{
		{
			// raw: (count+1)*ln(3+2): a 5, b 3, c 2; x1 has no zone: lowest.
			name: "the emptier zone scores higher",
			pod:  with(makePod("p", "", "", web), soft),
			a:    2, b: 1, c: 0,
			want: map[string]int64{"a1": 0, "b1": 66, "c1": 100, "x1": 0},
		},
		{
			name: "even zones score alike",
			pod:  with(makePod("p", "", "", web), soft),
			a:    1, b: 1, c: 1,
			want: map[string]int64{"a1": 100, "b1": 100, "c1": 100, "x1": 0},
		},
		{
			name: "no ScheduleAnyway constraint: every node the maximum",
			pod:  makePod("p", "", "", web),
			a:    3, b: 0, c: 0,
			want: map[string]int64{"a1": 100, "b1": 100, "c1": 100, "x1": 100},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			nodes := spreadNodes(tc.a, tc.b, tc.c, nil)
			// newState sets state.allNodes, which PreScore counts over, as Scheduler.decide does.
			got := scoreAll(t, podTopologySpread{}, tc.pod, nodes, nodes, nil)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("scores = %v, want %v", got, tc.want)
			}
		})
	}

	t.Run("PreScore counts over all nodes, not only the feasible ones", func(t *testing.T) {
		nodes := spreadNodes(2, 0, 0, nil)
		pod := with(makePod("p", "", "", web), soft)
		// a1 is infeasible, but its two pods still make zone a the crowded one; only b1 and c1 are scored.
		extraA := nodeInfoOf(stdNode("a2", map[string]string{zoneKey: "a"}))
		all := append(nodes, extraA)
		feasible := []*NodeInfo{extraA, nodes[1]}
		got := scoreAll(t, podTopologySpread{}, pod, all, feasible, nil)
		if want := map[string]int64{"a2": 0, "b1": 100}; !reflect.DeepEqual(got, want) {
			t.Errorf("scores = %v, want %v", got, want)
		}
	})
}

// ---------------------------------------------------------------------------------------------------------
// ImageLocality.
// ---------------------------------------------------------------------------------------------------------

func withImages(n *corev1.Node, images ...corev1.ContainerImage) *corev1.Node {
	n.Status.Images = images
	return n
}

func TestImageLocalityScore(t *testing.T) {
	nginx := corev1.ContainerImage{Names: []string{"docker.io/library/nginx:1.25", "docker.io/library/nginx@sha256:abc"}, SizeBytes: 500 * mib}
	huge := corev1.ContainerImage{Names: []string{"registry.local:5000/ml/train:2"}, SizeBytes: 3000 * mib}
	tiny := corev1.ContainerImage{Names: []string{"docker.io/library/busybox:latest"}, SizeBytes: 1 * mib}
	tests := []struct {
		name  string
		pod   *corev1.Pod
		nodes []*corev1.Node
		want  map[string]int64
	}{
		{
			// 500Mi spread over 1 of 3 nodes: 500Mi/3 -> 100*(174762666-23Mi)/(1000Mi-23Mi) = 14.
			name: "the node holding a large image scores higher",
			pod:  with(makePod("p", "", "", nil), withImage("nginx:1.25")),
			nodes: []*corev1.Node{
				withImages(stdNode("has", nil), nginx), stdNode("lacks", nil), withImages(stdNode("tiny", nil), tiny),
			},
			want: map[string]int64{"has": 14, "lacks": 0, "tiny": 0},
		},
		{
			// 500Mi on every node: 100*(500Mi-23Mi)/(1000Mi-23Mi) = 48.
			name: "an image on every node scores by its full size",
			pod:  with(makePod("p", "", "", nil), withImage("nginx:1.25")),
			nodes: []*corev1.Node{
				withImages(stdNode("n1", nil), nginx), withImages(stdNode("n2", nil), nginx),
			},
			want: map[string]int64{"n1": 48, "n2": 48},
		},
		{
			name:  "images below 23MB score 0",
			pod:   with(makePod("p", "", "", nil), withImage("busybox")),
			nodes: []*corev1.Node{withImages(stdNode("n1", nil), tiny), withImages(stdNode("n2", nil), tiny)},
			want:  map[string]int64{"n1": 0, "n2": 0},
		},
		{
			name:  "the score saturates at 100",
			pod:   with(makePod("p", "", "", nil), withImage("registry.local:5000/ml/train:2")),
			nodes: []*corev1.Node{withImages(stdNode("n1", nil), huge)},
			want:  map[string]int64{"n1": 100},
		},
		{
			name:  "another tag does not match",
			pod:   with(makePod("p", "", "", nil), withImage("nginx:1.26")),
			nodes: []*corev1.Node{withImages(stdNode("n1", nil), nginx)},
			want:  map[string]int64{"n1": 0},
		},
		{
			// Two containers double the saturation threshold: 100*(500Mi-23Mi)/(2000Mi-23Mi) = 24.
			name:  "the threshold grows with the containers",
			pod:   with(makePod("p", "", "", nil), withImage("nginx:1.25", "busybox")),
			nodes: []*corev1.Node{withImages(stdNode("n1", nil), nginx)},
			want:  map[string]int64{"n1": 24},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Count images through the cache, as the scheduler does.
			c := NewCache()
			for _, n := range tc.nodes {
				c.SetNode(n)
			}
			snap := c.Snapshot()
			defer snap.Release()
			state := NewCycleState(NewPodInfo(tc.pod), nil)
			state.NodeCount, state.ImageNodes, state.allNodes = len(snap.Nodes), snap.ImageNodes, snap.Nodes
			got := map[string]int64{}
			for _, n := range snap.Nodes {
				v, st := imageLocality{}.Score(context.Background(), state, tc.pod, n)
				if !st.IsSuccess() {
					t.Fatalf("Score(%s): %v", n.Name(), st)
				}
				got[n.Name()] = v
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("scores = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestNormalizeImage(t *testing.T) {
	tests := []struct{ in, want string }{
		{"busybox", "docker.io/library/busybox:latest"},
		{"busybox:1.36", "docker.io/library/busybox:1.36"},
		{"nginx:1.25", "docker.io/library/nginx:1.25"},
		{"user/app", "docker.io/user/app:latest"},
		{"user/app:v2", "docker.io/user/app:v2"},
		{"docker.io/library/nginx:1.25", "docker.io/library/nginx:1.25"},
		{"registry.local:5000/app", "registry.local:5000/app:latest"},
		{"registry.local:5000/app:3", "registry.local:5000/app:3"},
		{"localhost/app", "localhost/app:latest"},
		{"quay.io/x/y:1", "quay.io/x/y:1"},
		{"quay.io/x/y", "quay.io/x/y:latest"},
		{"docker.io/library/nginx@sha256:abc", "docker.io/library/nginx@sha256:abc"},
		{"nginx@sha256:abc", "docker.io/library/nginx@sha256:abc"},
		{"registry.local:5000/app@sha256:abc", "registry.local:5000/app@sha256:abc"},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			if got := normalizeImage(tc.in); got != tc.want {
				t.Errorf("normalizeImage(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

// ---------------------------------------------------------------------------------------------------------
// FitError and numFeasibleToFind.
// ---------------------------------------------------------------------------------------------------------

func TestFitErrorError(t *testing.T) {
	tests := []struct {
		name string
		err  FitError
		want string
	}{
		{"reasons sorted", FitError{NumNodes: 5, Reasons: map[string]int{
			reasonNodeAffinity: 3, reasonInsufficientCPU: 2,
		}}, "0/5 nodes are available: 2 Insufficient cpu, 3 node(s) didn't match Pod's node affinity/selector."},
		{"one reason", FitError{NumNodes: 1, Reasons: map[string]int{reasonUnschedulable: 1}},
			"0/1 nodes are available: 1 node(s) were unschedulable."},
		{"same count, sorted by reason", FitError{NumNodes: 2, Reasons: map[string]int{
			reasonInsufficientMem: 1, reasonInsufficientCPU: 1, "Too many pods": 1,
		}}, "0/2 nodes are available: 1 Insufficient cpu, 1 Insufficient memory, 1 Too many pods."},
		{"zero nodes", FitError{NumNodes: 0, Reasons: map[string]int{}}, "no nodes available to schedule pods"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.err.Error(); got != tc.want {
				t.Errorf("Error() = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestNumFeasibleToFind(t *testing.T) {
	tests := []struct{ total, want int }{
		{0, 0},
		{1, 1},
		{50, 50},
		{99, 99},
		{100, 100}, // 50% of 100 = 50, raised to the floor of 100
		{199, 100},
		{1000, 420},  // 50-8 = 42%
		{5000, 500},  // 50-40 = 10%
		{6000, 300},  // 50-48 = 2%, raised to 5%
		{10000, 500}, // 5%
	}
	for _, tc := range tests {
		if got := numFeasibleToFind(tc.total); got != tc.want {
			t.Errorf("numFeasibleToFind(%d) = %d, want %d", tc.total, got, tc.want)
		}
	}
}

// ---------------------------------------------------------------------------------------------------------
// Scheduler decisions without an API.
// ---------------------------------------------------------------------------------------------------------

func newTestScheduler(seed int64, nodes []*corev1.Node, pods map[string][]*corev1.Pod) *Scheduler {
	s := New(Config{Seed: seed})
	for _, n := range nodes {
		s.cache.SetNode(n)
	}
	for node, ps := range pods {
		for _, p := range ps {
			p.Spec.NodeName = node
			s.cache.SetPod(p)
		}
	}
	return s
}

func decide(s *Scheduler, pod *corev1.Pod) (string, *FitError) {
	snap := s.cache.Snapshot()
	defer snap.Release()
	return s.decide(context.Background(), NewPodInfo(pod), snap)
}

func TestSchedulerDecide(t *testing.T) {
	zoneA := map[string]string{zoneKey: "a"}
	gpuTaint := taint("dedicated", "gpu", corev1.TaintEffectNoSchedule)
	cordoned := func(n *corev1.Node) *corev1.Node { n.Spec.Unschedulable = true; return n }
	// Every node but "fits" rejects the pod below for one reason.
	mixedNodes := func(withFit bool) []*corev1.Node {
		nodes := []*corev1.Node{
			makeNode("tainted", "8", "16Gi", "110", zoneA, gpuTaint),
			makeNode("small", "1", "16Gi", "110", zoneA),
			cordoned(makeNode("cordoned", "8", "16Gi", "110", zoneA)),
			makeNode("zone-b", "8", "16Gi", "110", map[string]string{zoneKey: "b"}),
			makeNode("port-taken", "8", "16Gi", "110", zoneA),
		}
		if withFit {
			nodes = append(nodes, makeNode("fits", "4", "16Gi", "110", zoneA))
		}
		return nodes
	}
	mixedPods := func() map[string][]*corev1.Pod {
		return map[string][]*corev1.Pod{
			"port-taken": {with(makePod("web-0", "", "", nil), withHostPorts(corev1.ContainerPort{ContainerPort: 80, HostPort: 80}))},
		}
	}
	mixedPod := func() *corev1.Pod {
		return with(makePod("p", "2", "1Gi", nil),
			withNodeSelector(zoneA),
			withHostPorts(corev1.ContainerPort{ContainerPort: 80, HostPort: 80}))
	}
	tests := []struct {
		name     string
		pod      *corev1.Pod
		nodes    []*corev1.Node
		existing map[string][]*corev1.Pod
		wantHost string
		wantErr  string
		wantCode map[string]Code // node -> status code in FitError.Statuses
	}{
		{
			name:     "mixed: the single node meeting affinity, taints, resources and ports",
			pod:      mixedPod(),
			nodes:    mixedNodes(true),
			existing: mixedPods(),
			wantHost: "fits",
		},
		{
			name:     "mixed without a fitting node: aggregate reasons",
			pod:      mixedPod(),
			nodes:    mixedNodes(false),
			existing: mixedPods(),
			wantErr: "0/5 nodes are available: 1 Insufficient cpu, 1 node(s) didn't have free ports for the requested pod ports, " +
				"1 node(s) didn't match Pod's node affinity/selector, 1 node(s) had untolerated taint {dedicated: gpu}, " +
				"1 node(s) were unschedulable.",
			wantCode: map[string]Code{
				"tainted": UnschedulableAndUnresolvable, "small": Unschedulable, "cordoned": UnschedulableAndUnresolvable,
				"zone-b": UnschedulableAndUnresolvable, "port-taken": Unschedulable,
			},
		},
		{
			name:    "no nodes",
			pod:     makePod("p", "", "", nil),
			wantErr: "no nodes available to schedule pods",
		},
		{
			name: "too big everywhere",
			pod:  makePod("p", "16", "1Gi", nil),
			nodes: []*corev1.Node{
				makeNode("n1", "8", "16Gi", "110", nil), makeNode("n2", "8", "16Gi", "110", nil),
			},
			wantErr:  "0/2 nodes are available: 2 Insufficient cpu.",
			wantCode: map[string]Code{"n1": Unschedulable, "n2": Unschedulable},
		},
		{
			name: "the least loaded of two feasible nodes",
			pod:  makePod("p", "1", "1Gi", nil),
			nodes: []*corev1.Node{
				makeNode("busy", "8", "16Gi", "110", nil), makeNode("idle", "8", "16Gi", "110", nil),
			},
			existing: map[string][]*corev1.Pod{"busy": {makePod("e1", "6", "12Gi", nil)}},
			wantHost: "idle",
		},
		{
			name: "preferred node affinity decides between equal nodes",
			pod: with(makePod("p", "1", "1Gi", nil), preferredNodeAffinity(corev1.PreferredSchedulingTerm{
				Weight: 10, Preference: exprTerm(expr(zoneKey, corev1.NodeSelectorOpIn, "b"))})),
			nodes: []*corev1.Node{
				makeNode("in-a", "8", "16Gi", "110", zoneA),
				makeNode("in-b", "8", "16Gi", "110", map[string]string{zoneKey: "b"}),
				makeNode("in-a-2", "8", "16Gi", "110", zoneA),
			},
			wantHost: "in-b",
		},
		{
			name: "required pod affinity and anti-affinity together",
			pod: with(makePod("p", "", "", map[string]string{"app": "web"}),
				requiredPodAffinity(podTerm(zoneKey, map[string]string{"app": "db"})),
				requiredPodAnti(podTerm(hostKey, map[string]string{"app": "web"}))),
			nodes: []*corev1.Node{
				makeNode("a1", "8", "16Gi", "110", zoneA),
				makeNode("a2", "8", "16Gi", "110", zoneA),
				makeNode("b1", "8", "16Gi", "110", map[string]string{zoneKey: "b"}),
			},
			existing: map[string][]*corev1.Pod{
				"a1": {makePod("db", "", "", map[string]string{"app": "db"}), makePod("web-0", "", "", map[string]string{"app": "web"})},
			},
			wantHost: "a2",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := newTestScheduler(1, tc.nodes, tc.existing)
			host, fitErr := decide(s, tc.pod)
			if tc.wantErr == "" {
				if fitErr != nil {
					t.Fatalf("decide: unexpected FitError %q", fitErr.Error())
				}
				if host != tc.wantHost {
					t.Errorf("host = %q, want %q", host, tc.wantHost)
				}
				return
			}
			if fitErr == nil {
				t.Fatalf("decide = %q, want FitError %q", host, tc.wantErr)
			}
			if host != "" {
				t.Errorf("host = %q alongside a FitError", host)
			}
			if got := fitErr.Error(); got != tc.wantErr {
				t.Errorf("FitError = %q, want %q", got, tc.wantErr)
			}
			if fitErr.NumNodes != len(tc.nodes) {
				t.Errorf("NumNodes = %d, want %d", fitErr.NumNodes, len(tc.nodes))
			}
			for node, code := range tc.wantCode {
				if got := fitErr.Statuses[node].Code(); got != code {
					t.Errorf("Statuses[%s] code = %v, want %v", node, got, code)
				}
			}
			if len(fitErr.Statuses) != len(tc.wantCode) {
				t.Errorf("Statuses has %d nodes, want %d", len(fitErr.Statuses), len(tc.wantCode))
			}
		})
	}
}

func TestSchedulerTieBreakDeterministic(t *testing.T) {
	nodes := func() []*corev1.Node {
		var out []*corev1.Node
		for i := range 5 {
			out = append(out, makeNode(fmt.Sprintf("n%d", i), "8", "16Gi", "110", nil))
		}
		return out
	}
	run := func(seed int64) []string {
		s := newTestScheduler(seed, nodes(), nil)
		var hosts []string
		for i := range 40 {
			host, fitErr := decide(s, makePod(fmt.Sprintf("p%d", i), "100m", "100Mi", nil))
			if fitErr != nil {
				t.Fatalf("decide: %v", fitErr)
			}
			hosts = append(hosts, host)
		}
		return hosts
	}
	first, second := run(7), run(7)
	if !reflect.DeepEqual(first, second) {
		t.Fatalf("same seed, different choices:\n%v\n%v", first, second)
	}
	distinct := map[string]bool{}
	for _, h := range first {
		distinct[h] = true
	}
	// Every node scores alike, so the ties must spread over the nodes rather than always pick one.
	if len(distinct) < 3 {
		t.Errorf("tie-breaking picked only %v over 40 decisions", distinct)
	}
}

// ---------------------------------------------------------------------------------------------------------
// Preemption.
// ---------------------------------------------------------------------------------------------------------

func victimNames(c *preemptionCandidate) []string {
	if c == nil {
		return nil
	}
	names := []string{}
	for _, v := range c.victims {
		names = append(names, v.Pod.Name)
	}
	sort.Strings(names)
	return names
}

func TestPreemptionVictims(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	low := func(name, cpu string, created time.Time) *corev1.Pod {
		return with(makePod(name, cpu, "", nil), withPriority(0), createdAt(created))
	}
	high := func(name, cpu string) *corev1.Pod {
		return with(makePod(name, cpu, "", nil), withPriority(100), createdAt(t0))
	}
	tests := []struct {
		name     string
		nodeCPU  string
		existing []*corev1.Pod
		pod      *corev1.Pod
		want     []string // nil: no candidate
	}{
		{
			name:     "one low pod makes room; the priority-100 pod stays",
			nodeCPU:  "2",
			existing: []*corev1.Pod{low("low", "1", t0), high("high", "1")},
			pod:      with(makePod("p", "1", "", nil), withPriority(1000)),
			want:     []string{"low"},
		},
		{
			name:     "a big low pod is enough",
			nodeCPU:  "3",
			existing: []*corev1.Pod{low("low", "2", t0), high("high", "1")},
			pod:      with(makePod("p", "1", "", nil), withPriority(1000)),
			want:     []string{"low"},
		},
		{
			name:     "both pods must go",
			nodeCPU:  "2",
			existing: []*corev1.Pod{low("low", "1", t0), high("high", "1")},
			pod:      with(makePod("p", "2", "", nil), withPriority(1000)),
			want:     []string{"high", "low"},
		},
		{
			name:    "the two low pods go, the high pod stays",
			nodeCPU: "3",
			existing: []*corev1.Pod{
				low("low-a", "1", t0), low("low-b", "1", t0.Add(time.Minute)), high("high", "1"),
			},
			pod:  with(makePod("p", "2", "", nil), withPriority(1000)),
			want: []string{"low-a", "low-b"},
		},
		{
			name:     "a pod of equal or higher priority is never a victim",
			nodeCPU:  "2",
			existing: []*corev1.Pod{low("low", "1", t0), high("high", "1")},
			pod:      with(makePod("p", "1", "", nil), withPriority(100)),
			want:     []string{"low"},
		},
		{
			name:     "evicting the lower pods is not enough",
			nodeCPU:  "2",
			existing: []*corev1.Pod{low("low", "1", t0), high("high", "1")},
			pod:      with(makePod("p", "2", "", nil), withPriority(100)),
			want:     nil,
		},
		{
			name:     "no lower-priority pods",
			nodeCPU:  "2",
			existing: []*corev1.Pod{high("high", "2")},
			pod:      with(makePod("p", "1", "", nil), withPriority(50)),
			want:     nil,
		},
		{
			name:     "nil priority counts as 0",
			nodeCPU:  "2",
			existing: []*corev1.Pod{makePod("nopriority", "2", "", nil)},
			pod:      with(makePod("p", "1", "", nil), withPriority(1)),
			want:     []string{"nopriority"},
		},
		{
			name:    "between equal priorities the newer pod leaves",
			nodeCPU: "2",
			existing: []*corev1.Pod{
				low("low-old", "1", t0), low("low-new", "1", t0.Add(time.Hour)),
			},
			pod:  with(makePod("p", "1", "", nil), withPriority(1000)),
			want: []string{"low-new"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			node := makeNode("n1", tc.nodeCPU, "16Gi", "110", nil)
			s := newTestScheduler(1, []*corev1.Node{node}, map[string][]*corev1.Pod{"n1": tc.existing})
			info := NewPodInfo(tc.pod)
			snap := s.cache.Snapshot()
			defer snap.Release()
			n := snap.Node("n1")
			podsBefore, cpuBefore := len(n.Pods), n.Requested.MilliCPU
			c := s.victimsOn(context.Background(), info, s.podPriority(tc.pod), n, snap)
			if tc.want == nil {
				if c != nil {
					t.Fatalf("victimsOn = %v, want no candidate", victimNames(c))
				}
			} else {
				if c == nil {
					t.Fatalf("victimsOn = nil, want victims %v", tc.want)
				}
				if c.node != "n1" {
					t.Errorf("candidate node = %q, want n1", c.node)
				}
				if got := victimNames(c); !reflect.DeepEqual(got, tc.want) {
					t.Errorf("victims = %v, want %v", got, tc.want)
				}
			}
			if len(n.Pods) != podsBefore || n.Requested.MilliCPU != cpuBefore {
				t.Errorf("victimsOn changed the snapshot's node: %d pods / %dm, was %d / %dm",
					len(n.Pods), n.Requested.MilliCPU, podsBefore, cpuBefore)
			}
		})
	}
}

func TestPreemptionBetter(t *testing.T) {
	s := New(Config{Seed: 1})
	cand := func(node string, priorities ...int32) *preemptionCandidate {
		c := &preemptionCandidate{node: node}
		for i, p := range priorities {
			c.victims = append(c.victims, NewPodInfo(with(makePod(fmt.Sprintf("%s-v%d", node, i), "", "", nil), withPriority(p))))
		}
		return c
	}
	tests := []struct {
		name string
		a, b *preemptionCandidate
		want bool // a better than b
	}{
		{"lower highest victim priority wins", cand("a", 0, 0, 0), cand("b", 100), true},
		{"higher highest victim priority loses", cand("a", 100), cand("b", 0, 0, 0), false},
		{"same highest, lower sum wins", cand("a", 50, 10), cand("b", 50, 40), true},
		{"same highest, higher sum loses", cand("a", 50, 40), cand("b", 50, 10), false},
		{"same highest and sum, fewer victims wins", cand("a", 0), cand("b", 0, 0), true},
		{"same highest and sum, more victims loses", cand("a", 0, 0), cand("b", 0), false},
		{"identical candidates: neither is better", cand("a", 10, 5), cand("b", 10, 5), false},
		{"negative priorities: more victims must not win", cand("a", -5, -5), cand("b", -5), false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := s.better(tc.a, tc.b); got != tc.want {
				t.Errorf("better(%v, %v) = %v, want %v", victimNames(tc.a), victimNames(tc.b), got, tc.want)
			}
		})
	}
}
