package controller

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	coordinationlisters "k8s.io/client-go/listers/coordination/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/skiff-dev/skiff/gossip"
)

var lifecycleT0 = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

func mtime(t time.Time) *metav1.Time { m := metav1.NewTime(t); return &m }

func i64(v int64) *int64 { return &v }

func TestJudgeNode(t *testing.T) {
	now := lifecycleT0
	grace := 40 * time.Second
	lease := func(renew *metav1.MicroTime) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "n", Namespace: corev1.NamespaceNodeLease},
			Spec: coordinationv1.LeaseSpec{RenewTime: renew}}
	}
	micro := func(t time.Time) *metav1.MicroTime { m := metav1.NewMicroTime(t); return &m }
	member := func(s gossip.Status) *gossip.Member { return &gossip.Member{Name: "m", Status: s} }
	cases := []struct {
		name   string
		member *gossip.Member
		lease  *coordinationv1.Lease
		want   nodeHealth
	}{
		{"member alive", member(gossip.StatusAlive), nil, healthReady},
		{"member dead", member(gossip.StatusDead), nil, healthUnreachable},
		{"member left", member(gossip.StatusLeft), nil, healthShutdown},
		{"member alive wins over stale lease", member(gossip.StatusAlive), lease(micro(now.Add(-time.Hour))), healthReady},
		{"member dead wins over fresh lease", member(gossip.StatusDead), lease(micro(now)), healthUnreachable},
		{"no member, fresh lease", nil, lease(micro(now.Add(-10 * time.Second))), healthReady},
		{"no member, lease exactly at grace", nil, lease(micro(now.Add(-grace))), healthReady},
		{"no member, stale lease", nil, lease(micro(now.Add(-grace - time.Second))), healthUnreachable},
		{"no member, no lease", nil, nil, healthUntracked},
		{"no member, lease without renewTime", nil, lease(nil), healthUntracked},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := judgeNode(tc.member, tc.lease, now, grace); got != tc.want {
				t.Errorf("judgeNode = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestWantReadyAndTaintKey(t *testing.T) {
	cases := []struct {
		name       string
		health     nodeHealth
		wantNil    bool
		wantStatus corev1.ConditionStatus
		wantReason string
		wantTaint  string
	}{
		{"untracked", healthUntracked, true, "", "", ""},
		{"ready", healthReady, false, corev1.ConditionTrue, "AgentReady", ""},
		{"unreachable", healthUnreachable, false, corev1.ConditionUnknown, "NodeStatusUnknown", taintUnreachable},
		{"shutdown", healthShutdown, false, corev1.ConditionFalse, "NodeShutdown", taintNotReady},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := wantReady(tc.health)
			switch {
			case tc.wantNil && got != nil:
				t.Errorf("wantReady = %+v, want nil", got)
			case !tc.wantNil && got == nil:
				t.Errorf("wantReady = nil, want %s/%s", tc.wantStatus, tc.wantReason)
			case got != nil:
				if got.Type != corev1.NodeReady || got.Status != tc.wantStatus || got.Reason != tc.wantReason {
					t.Errorf("wantReady = %s=%s (%s), want Ready=%s (%s)", got.Type, got.Status, got.Reason, tc.wantStatus, tc.wantReason)
				}
			}
			if k := wantTaintKey(tc.health); k != tc.wantTaint {
				t.Errorf("wantTaintKey = %q, want %q", k, tc.wantTaint)
			}
		})
	}
}

// taintStrings renders taints as key=value:effect[@unix], for comparison.
func taintStrings(taints []corev1.Taint) []string {
	out := []string{}
	for _, t := range taints {
		s := t.Key
		if t.Value != "" {
			s += "=" + t.Value
		}
		s += ":" + string(t.Effect)
		if t.TimeAdded != nil {
			s += fmt.Sprintf("@%d", t.TimeAdded.Unix())
		}
		out = append(out, s)
	}
	return out
}

func TestWithHealthTaints(t *testing.T) {
	now := lifecycleT0
	t0 := now.Add(-time.Minute)
	user := corev1.Taint{Key: "dedicated", Value: "infra", Effect: corev1.TaintEffectNoSchedule}
	unrNS := corev1.Taint{Key: taintUnreachable, Effect: corev1.TaintEffectNoSchedule}
	unrNE := corev1.Taint{Key: taintUnreachable, Effect: corev1.TaintEffectNoExecute, TimeAdded: mtime(t0)}
	nrNS := corev1.Taint{Key: taintNotReady, Effect: corev1.TaintEffectNoSchedule}
	nrNE := corev1.Taint{Key: taintNotReady, Effect: corev1.TaintEffectNoExecute, TimeAdded: mtime(t0)}
	n, o := now.Unix(), t0.Unix()
	cases := []struct {
		name        string
		taints      []corev1.Taint
		key         string
		want        []string
		wantChanged bool
	}{
		{"none to unreachable", nil, taintUnreachable,
			[]string{taintUnreachable + ":NoSchedule", fmt.Sprintf("%s:NoExecute@%d", taintUnreachable, n)}, true},
		{"none to not-ready", nil, taintNotReady,
			[]string{taintNotReady + ":NoSchedule", fmt.Sprintf("%s:NoExecute@%d", taintNotReady, n)}, true},
		{"user taint kept", []corev1.Taint{user}, taintUnreachable,
			[]string{"dedicated=infra:NoSchedule", taintUnreachable + ":NoSchedule", fmt.Sprintf("%s:NoExecute@%d", taintUnreachable, n)}, true},
		{"unreachable to not-ready", []corev1.Taint{user, unrNS, unrNE}, taintNotReady,
			[]string{"dedicated=infra:NoSchedule", taintNotReady + ":NoSchedule", fmt.Sprintf("%s:NoExecute@%d", taintNotReady, n)}, true},
		{"not-ready to unreachable", []corev1.Taint{nrNS, nrNE}, taintUnreachable,
			[]string{taintUnreachable + ":NoSchedule", fmt.Sprintf("%s:NoExecute@%d", taintUnreachable, n)}, true},
		{"ready removes both keys", []corev1.Taint{unrNS, user, unrNE, nrNS, nrNE}, "",
			[]string{"dedicated=infra:NoSchedule"}, true},
		{"ready with only user taint", []corev1.Taint{user}, "", []string{"dedicated=infra:NoSchedule"}, false},
		{"ready with no taints", nil, "", []string{}, false},
		{"already as wanted keeps TimeAdded", []corev1.Taint{user, unrNS, unrNE}, taintUnreachable,
			[]string{"dedicated=infra:NoSchedule", taintUnreachable + ":NoSchedule", fmt.Sprintf("%s:NoExecute@%d", taintUnreachable, o)}, false},
		{"missing NoSchedule added, NoExecute TimeAdded kept", []corev1.Taint{unrNE}, taintUnreachable,
			[]string{fmt.Sprintf("%s:NoExecute@%d", taintUnreachable, o), taintUnreachable + ":NoSchedule"}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.taints)
			got, changed := withHealthTaints(in, tc.key, now)
			if gs := taintStrings(got); !slices.Equal(gs, tc.want) {
				t.Errorf("taints = %v, want %v", gs, tc.want)
			}
			if changed != tc.wantChanged {
				t.Errorf("changed = %v, want %v", changed, tc.wantChanged)
			}
			if !slices.Equal(taintStrings(in), taintStrings(tc.taints)) {
				t.Errorf("input taints modified: %v", taintStrings(in))
			}
		})
	}
}

func TestEvictAt(t *testing.T) {
	now := lifecycleT0
	t0 := now.Add(-2 * time.Second)
	unreachable := corev1.Taint{Key: taintUnreachable, Effect: corev1.TaintEffectNoExecute, TimeAdded: mtime(t0)}
	tol := func(key string, op corev1.TolerationOperator, effect corev1.TaintEffect, secs *int64) corev1.Toleration {
		return corev1.Toleration{Key: key, Operator: op, Effect: effect, TolerationSeconds: secs}
	}
	cases := []struct {
		name        string
		tolerations []corev1.Toleration
		taint       corev1.Taint
		wantAt      time.Time
		wantEvict   bool
	}{
		{"no tolerations: now", nil, unreachable, now, true},
		{"toleration without seconds: never", []corev1.Toleration{tol(taintUnreachable, corev1.TolerationOpExists, corev1.TaintEffectNoExecute, nil)}, unreachable, time.Time{}, false},
		{"toleration with empty effect without seconds: never", []corev1.Toleration{tol(taintUnreachable, corev1.TolerationOpExists, "", nil)}, unreachable, time.Time{}, false},
		{"5 seconds from TimeAdded", []corev1.Toleration{tol(taintUnreachable, corev1.TolerationOpExists, corev1.TaintEffectNoExecute, i64(5))}, unreachable, t0.Add(5 * time.Second), true},
		{"Exists with empty key tolerates everything", []corev1.Toleration{tol("", corev1.TolerationOpExists, "", nil)}, unreachable, time.Time{}, false},
		{"Exists with empty key for NoSchedule only does not tolerate NoExecute", []corev1.Toleration{tol("", corev1.TolerationOpExists, corev1.TaintEffectNoSchedule, nil)}, unreachable, now, true},
		{"different key does not count", []corev1.Toleration{tol(taintNotReady, corev1.TolerationOpExists, corev1.TaintEffectNoExecute, nil)}, unreachable, now, true},
		{"different key skipped, matching one used", []corev1.Toleration{
			tol(taintNotReady, corev1.TolerationOpExists, corev1.TaintEffectNoExecute, nil),
			tol(taintUnreachable, corev1.TolerationOpExists, corev1.TaintEffectNoExecute, i64(30)),
		}, unreachable, t0.Add(30 * time.Second), true},
		{"negative seconds as 0", []corev1.Toleration{tol(taintUnreachable, corev1.TolerationOpExists, corev1.TaintEffectNoExecute, i64(-10))}, unreachable, t0, true},
		{"zero seconds", []corev1.Toleration{tol(taintUnreachable, corev1.TolerationOpExists, corev1.TaintEffectNoExecute, i64(0))}, unreachable, t0, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{Spec: corev1.PodSpec{Tolerations: tc.tolerations}}
			added := now
			if tc.taint.TimeAdded != nil {
				added = tc.taint.TimeAdded.Time
			}
			at, evict := evictAt(pod, tc.taint, added, now)
			if evict != tc.wantEvict || !at.Equal(tc.wantAt) {
				t.Errorf("evictAt = (%v, %v), want (%v, %v)", at, evict, tc.wantAt, tc.wantEvict)
			}
		})
	}
}

// --- reconcile ---

type fakeMembers struct {
	members   []gossip.Member
	reachable map[string]bool // members that answer a direct probe

	mu     sync.Mutex
	probed []string
}

func (f *fakeMembers) Members() []gossip.Member                 { return f.members }
func (f *fakeMembers) SuspicionTimeout() time.Duration          { return 5 * time.Second }
func (f *fakeMembers) Subscribe() (<-chan gossip.Event, func()) { return nil, func() {} }
func (f *fakeMembers) Reachable(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.probed = append(f.probed, name)
	return f.reachable[name]
}

// takeProbes returns the members probed since the last call, sorted.
func (f *fakeMembers) takeProbes() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.probed
	f.probed = nil
	sort.Strings(out)
	return out
}

var _ Members = (*fakeMembers)(nil)

func member(name string, status gossip.Status, nodes ...string) gossip.Member {
	return gossip.Member{Name: name, Status: status, Meta: gossip.Meta{Role: gossip.RoleAgent, Nodes: nodes}}
}

func readyCond(status corev1.ConditionStatus, reason string) corev1.NodeCondition {
	return corev1.NodeCondition{Type: corev1.NodeReady, Status: status, Reason: reason}
}

func testNode(name string, ready corev1.NodeCondition, taints ...corev1.Taint) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name)},
		Spec: corev1.NodeSpec{Taints: taints}, Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{ready}}}
}

func unreachableTaints(added time.Time) []corev1.Taint {
	return []corev1.Taint{
		{Key: taintUnreachable, Effect: corev1.TaintEffectNoSchedule},
		{Key: taintUnreachable, Effect: corev1.TaintEffectNoExecute, TimeAdded: mtime(added)},
	}
}

func testPod(name, node string, tolerations ...corev1.Toleration) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name)},
		Spec:       corev1.PodSpec{NodeName: node, Tolerations: tolerations},
		Status: corev1.PodStatus{Phase: corev1.PodRunning,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
}

func testLease(node string, renew time.Time) *coordinationv1.Lease {
	m := metav1.NewMicroTime(renew)
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: node, Namespace: corev1.NamespaceNodeLease},
		Spec: coordinationv1.LeaseSpec{RenewTime: &m}}
}

type lifecycleHarness struct {
	kube     *fake.Clientset
	l        *lifecycle
	recorder *record.FakeRecorder
}

type lifecycleWorld struct {
	members []gossip.Member
	// reachable are the failed members that answer a direct probe all the same (a stale view).
	reachable []string
	nodes     []*corev1.Node
	pods      []*corev1.Pod
	leases    []*coordinationv1.Lease
	warmAt    time.Time
	// disrupted starts the controller in full-disruption mode.
	disrupted bool
}

func newLifecycleHarness(t *testing.T, w lifecycleWorld) *lifecycleHarness {
	t.Helper()
	var objs []runtime.Object
	nodeIdx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	leaseIdx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	podIdx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{podsByNode: func(obj any) ([]string, error) {
		return []string{obj.(*corev1.Pod).Spec.NodeName}, nil
	}})
	for _, n := range w.nodes {
		objs = append(objs, n.DeepCopy())
		if err := nodeIdx.Add(n); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range w.pods {
		objs = append(objs, p.DeepCopy())
		if err := podIdx.Add(p); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range w.leases {
		objs = append(objs, l.DeepCopy())
		if err := leaseIdx.Add(l); err != nil {
			t.Fatal(err)
		}
	}
	kube := fake.NewSimpleClientset(objs...)
	rec := record.NewFakeRecorder(100)
	members := &fakeMembers{members: w.members, reachable: map[string]bool{}}
	for _, name := range w.reachable {
		members.reachable[name] = true
	}
	c := &Clients{Kube: kube, Logger: hclog.NewNullLogger(), Recorder: rec, Members: members}
	l := &lifecycle{
		c:           c,
		cfg:         NodeLifecycleConfig{LeaseGrace: 40 * time.Second, PodGCTimeout: 10 * time.Minute},
		nodes:       corelisters.NewNodeLister(nodeIdx),
		podIndex:    podIdx,
		leases:      coordinationlisters.NewLeaseLister(leaseIdx),
		warmAt:      w.warmAt,
		orphanSince: map[string]time.Time{},

		failureConfirmed: map[string]time.Time{},
		answering:        map[string]bool{},
	}
	l.disrupted = w.disrupted
	return &lifecycleHarness{kube: kube, l: l, recorder: rec}
}

// deletion is one pod delete the controller sent.
type deletion struct {
	name  string
	grace *int64
}

func (h *lifecycleHarness) podDeletes() map[string]deletion {
	out := map[string]deletion{}
	for _, a := range h.kube.Actions() {
		if d, ok := a.(k8stesting.DeleteActionImpl); ok && d.GetResource().Resource == "pods" {
			out[d.GetName()] = deletion{name: d.GetName(), grace: d.GetDeleteOptions().GracePeriodSeconds}
		}
	}
	return out
}

// writes lists "verb resource[/subresource] name" for every update the controller sent.
func (h *lifecycleHarness) writes() []string {
	var out []string
	for _, a := range h.kube.Actions() {
		if a.GetVerb() == "get" || a.GetVerb() == "list" || a.GetVerb() == "watch" {
			continue
		}
		res := a.GetResource().Resource
		if a.GetSubresource() != "" {
			res += "/" + a.GetSubresource()
		}
		name := ""
		switch act := a.(type) {
		case k8stesting.UpdateAction:
			if m, err := meta.Accessor(act.GetObject()); err == nil {
				name = m.GetName()
			}
		case k8stesting.DeleteAction:
			name = act.GetName()
		}
		out = append(out, a.GetVerb()+" "+res+" "+name)
	}
	return out
}

func (h *lifecycleHarness) node(t *testing.T, name string) *corev1.Node {
	t.Helper()
	n, err := h.kube.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get node %s: %v", name, err)
	}
	return n
}

func (h *lifecycleHarness) pod(t *testing.T, name string) *corev1.Pod {
	t.Helper()
	p, err := h.kube.CoreV1().Pods("default").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get pod %s: %v", name, err)
	}
	return p
}

func nodeReady(n *corev1.Node) corev1.NodeCondition {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c
		}
	}
	return corev1.NodeCondition{}
}

func podReady(p *corev1.Pod) corev1.ConditionStatus {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status
		}
	}
	return ""
}

func checkNode(t *testing.T, h *lifecycleHarness, name string, status corev1.ConditionStatus, reason string, taints []string) {
	t.Helper()
	n := h.node(t, name)
	if c := nodeReady(n); c.Status != status || c.Reason != reason {
		t.Errorf("node %s Ready = %s (%s), want %s (%s)", name, c.Status, c.Reason, status, reason)
	}
	got := taintStrings(n.Spec.Taints)
	slices.Sort(got)
	want := slices.Clone(taints)
	if want == nil {
		want = []string{}
	}
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("node %s taints = %v, want %v", name, got, want)
	}
}

func checkDeleted(t *testing.T, h *lifecycleHarness, want map[string]*int64) {
	t.Helper()
	got := h.podDeletes()
	for name, grace := range want {
		d, ok := got[name]
		if !ok {
			t.Errorf("pod %s not deleted (writes: %v)", name, h.writes())
			continue
		}
		switch {
		case grace == nil && d.grace != nil:
			t.Errorf("pod %s deleted with grace %d, want a graceful delete", name, *d.grace)
		case grace != nil && (d.grace == nil || *d.grace != *grace):
			t.Errorf("pod %s deleted with grace %v, want %d", name, ptrString(d.grace), *grace)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("pod %s deleted, want it kept", name)
		}
	}
}

func ptrString(p *int64) string {
	if p == nil {
		return "nil"
	}
	return fmt.Sprint(*p)
}

func TestReconcileLifecycle(t *testing.T) {
	now := lifecycleT0
	past := now.Add(-time.Hour) // warm-up long over
	unr := func(at time.Time) []string {
		return []string{taintUnreachable + ":NoSchedule", fmt.Sprintf("%s:NoExecute@%d", taintUnreachable, at.Unix())}
	}
	nr := func(at time.Time) []string {
		return []string{taintNotReady + ":NoSchedule", fmt.Sprintf("%s:NoExecute@%d", taintNotReady, at.Unix())}
	}
	ready := readyCond(corev1.ConditionTrue, "AgentReady")
	unknown := readyCond(corev1.ConditionUnknown, "NodeStatusUnknown")
	user := corev1.Taint{Key: "dedicated", Value: "infra", Effect: corev1.TaintEffectNoSchedule}
	tainted := now.Add(-10 * time.Second) // when the lost nodes' taints were added
	forever := corev1.Toleration{Key: taintUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}
	for300 := corev1.Toleration{Key: taintUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: i64(300)}
	for5 := corev1.Toleration{Key: taintUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: i64(5)}
	terminating := func(p *corev1.Pod, since time.Time) *corev1.Pod {
		p.DeletionTimestamp = mtime(since)
		p.DeletionGracePeriodSeconds = i64(30)
		return p
	}
	succeeded := func(p *corev1.Pod) *corev1.Pod { p.Status.Phase = corev1.PodSucceeded; return p }

	cases := []struct {
		name  string
		world lifecycleWorld
		// passes are the times reconcile runs at, in order; now alone when empty.
		passes []time.Time
		check  func(t *testing.T, h *lifecycleHarness)
	}{
		{
			name: "node health from member status and lease",
			world: lifecycleWorld{
				warmAt: past,
				members: []gossip.Member{
					member("a-dead", gossip.StatusDead, "n-dead"),
					member("a-left", gossip.StatusLeft, "n-left"),
					member("a-alive", gossip.StatusAlive, "n-back", "n-ok"),
					// A dead member that hosted n-moved before, and the alive one that hosts it now.
					member("a-old", gossip.StatusDead, "n-moved"),
					member("a-new", gossip.StatusAlive, "n-moved"),
					// The same, the alive member listed first.
					member("b-new", gossip.StatusAlive, "n-moved-2"),
					member("b-old", gossip.StatusDead, "n-moved-2"),
				},
				nodes: []*corev1.Node{
					testNode("n-dead", ready, user),
					testNode("n-left", ready),
					testNode("n-back", unknown, append([]corev1.Taint{user}, unreachableTaints(tainted)...)...),
					testNode("n-ok", ready),
					testNode("n-moved", ready),
					testNode("n-moved-2", ready),
					testNode("n-lease-fresh", unknown, unreachableTaints(tainted)...),
					testNode("n-lease-stale", ready),
				},
				leases: []*coordinationv1.Lease{
					testLease("n-lease-fresh", now.Add(-5*time.Second)),
					testLease("n-lease-stale", now.Add(-2*time.Minute)),
				},
			},
			check: func(t *testing.T, h *lifecycleHarness) {
				checkNode(t, h, "n-dead", corev1.ConditionUnknown, "NodeStatusUnknown", append([]string{"dedicated=infra:NoSchedule"}, unr(now)...))
				checkNode(t, h, "n-left", corev1.ConditionFalse, "NodeShutdown", nr(now))
				checkNode(t, h, "n-back", corev1.ConditionTrue, "AgentReady", []string{"dedicated=infra:NoSchedule"})
				checkNode(t, h, "n-ok", corev1.ConditionTrue, "AgentReady", nil)
				checkNode(t, h, "n-moved", corev1.ConditionTrue, "AgentReady", nil)
				checkNode(t, h, "n-moved-2", corev1.ConditionTrue, "AgentReady", nil)
				checkNode(t, h, "n-lease-fresh", corev1.ConditionTrue, "AgentReady", nil)
				checkNode(t, h, "n-lease-stale", corev1.ConditionUnknown, "NodeStatusUnknown", unr(now))
				for _, w := range h.writes() {
					if strings.HasSuffix(w, " n-ok") || strings.HasSuffix(w, " n-moved") || strings.HasSuffix(w, " n-moved-2") {
						t.Errorf("unexpected write to a node already as wanted: %s", w)
					}
				}
			},
		},
		{
			name: "warm-up: a new leader marks nothing unreachable",
			world: lifecycleWorld{
				warmAt:  now.Add(10 * time.Second),
				members: []gossip.Member{member("a-dead", gossip.StatusDead, "n-dead"), member("a-alive", gossip.StatusAlive, "n-ok")},
				nodes:   []*corev1.Node{testNode("n-dead", ready), testNode("n-ok", ready)},
				pods:    []*corev1.Pod{testPod("p", "n-dead")},
			},
			check: func(t *testing.T, h *lifecycleHarness) {
				checkNode(t, h, "n-dead", corev1.ConditionTrue, "AgentReady", nil)
				if w := h.writes(); len(w) != 0 {
					t.Errorf("writes during warm-up: %v", w)
				}
			},
		},
		{
			name: "a dead member's nodes: every Ready condition written before any taint",
			world: func() lifecycleWorld {
				// As many alive nodes again, and one more, so that the pass is not in full-disruption mode.
				w := lifecycleWorld{warmAt: past}
				var dead, alive []string
				for i := range 6*lifecycleWriters + 1 {
					name := fmt.Sprintf("n-%02d", i)
					if i < 3*lifecycleWriters {
						dead = append(dead, name)
					} else {
						alive = append(alive, name)
					}
					w.nodes = append(w.nodes, testNode(name, ready))
				}
				w.members = []gossip.Member{member("a-dead", gossip.StatusDead, dead...), member("a-alive", gossip.StatusAlive, alive...)}
				return w
			}(),
			check: func(t *testing.T, h *lifecycleHarness) {
				var conditions, taints int
				for _, w := range h.writes() {
					switch {
					case strings.HasPrefix(w, "update nodes/status "):
						if taints > 0 {
							t.Fatalf("a Ready condition written after %d taints: %s", taints, w)
						}
						conditions++
					case strings.HasPrefix(w, "update nodes "):
						taints++
					}
				}
				if want := 3 * lifecycleWriters; conditions != want || taints != want {
					t.Errorf("%d conditions and %d taints written, want %d of each", conditions, taints, want)
				}
				checkNode(t, h, "n-00", corev1.ConditionUnknown, "NodeStatusUnknown", unr(now))
			},
		},
		{
			name: "a failed member that answers a probe: its nodes and pods are left alone",
			world: lifecycleWorld{
				warmAt: past,
				members: []gossip.Member{
					member("a-stale", gossip.StatusDead, "n-stale"),
					member("a-marked", gossip.StatusDead, "n-was-marked"),
					member("a-dead", gossip.StatusDead, "n-dead"),
					member("a-alive", gossip.StatusAlive, "n-ok"),
				},
				reachable: []string{"a-stale", "a-marked"},
				nodes: []*corev1.Node{
					testNode("n-stale", ready), testNode("n-dead", ready), testNode("n-ok", ready),
					// Marked by an earlier confirmation, its toleration run out: not evicted while it answers.
					testNode("n-was-marked", unknown, unreachableTaints(now.Add(-time.Hour))...),
				},
				pods: []*corev1.Pod{testPod("p-stale", "n-stale"), testPod("p-marked", "n-was-marked")},
			},
			check: func(t *testing.T, h *lifecycleHarness) {
				checkNode(t, h, "n-stale", corev1.ConditionTrue, "AgentReady", nil)
				checkNode(t, h, "n-dead", corev1.ConditionUnknown, "NodeStatusUnknown", unr(now))
				for _, w := range h.writes() {
					if strings.HasSuffix(w, " n-stale") || strings.HasSuffix(w, " p-stale") || strings.HasSuffix(w, " p-marked") {
						t.Errorf("write for a member that answers its probe: %s", w)
					}
				}
				if d := h.podDeletes(); len(d) != 0 {
					t.Errorf("pods deleted: %v", d)
				}
			},
		},
		{
			name: "eviction by tolerations",
			world: lifecycleWorld{
				warmAt: past,
				members: []gossip.Member{
					member("a-dead", gossip.StatusDead, "n-lost"),
					member("a-alive", gossip.StatusAlive, "n-1", "n-2", "n-3"),
				},
				nodes: []*corev1.Node{
					testNode("n-lost", unknown, unreachableTaints(tainted)...),
					testNode("n-1", ready), testNode("n-2", ready), testNode("n-3", ready),
				},
				pods: []*corev1.Pod{
					testPod("p-none", "n-lost"),
					testPod("p-300", "n-lost", for300),
					testPod("p-forever", "n-lost", forever),
					testPod("p-5", "n-lost", for5), // 5 s of 10 s since the taint: expired
					succeeded(testPod("p-done", "n-lost")),
					testPod("p-healthy", "n-1"),
				},
			},
			check: func(t *testing.T, h *lifecycleHarness) {
				checkDeleted(t, h, map[string]*int64{"p-none": nil, "p-5": nil})
				for _, name := range []string{"p-300", "p-forever"} {
					if s := podReady(h.pod(t, name)); s != corev1.ConditionFalse {
						t.Errorf("pod %s Ready = %s, want False", name, s)
					}
				}
				if s := podReady(h.pod(t, "p-healthy")); s != corev1.ConditionTrue {
					t.Errorf("pod on a healthy node: Ready = %s, want True", s)
				}
				notReady := map[string]bool{}
				for _, w := range h.writes() {
					if name, ok := strings.CutPrefix(w, "update pods/status "); ok {
						notReady[name] = true
					}
				}
				for _, name := range []string{"p-none", "p-300", "p-forever", "p-5"} {
					if !notReady[name] {
						t.Errorf("pod %s not marked not Ready", name)
					}
				}
				for _, name := range []string{"p-done", "p-healthy"} {
					if notReady[name] {
						t.Errorf("pod %s marked not Ready", name)
					}
				}
				events := 0
				for len(h.recorder.Events) > 0 {
					if e := <-h.recorder.Events; strings.Contains(e, "TaintManagerEviction") {
						events++
					}
				}
				if events != 2 {
					t.Errorf("%d TaintManagerEviction events, want 2", events)
				}
			},
		},
		{
			name: "disruption guard: 2 of 3 unreachable evicts nothing",
			world: lifecycleWorld{
				warmAt: past,
				members: []gossip.Member{
					member("a-dead", gossip.StatusDead, "n-lost-1", "n-lost-2"),
					member("a-alive", gossip.StatusAlive, "n-ok"),
				},
				nodes: []*corev1.Node{
					testNode("n-lost-1", unknown, unreachableTaints(tainted)...),
					testNode("n-lost-2", ready),
					testNode("n-ok", ready),
				},
				pods: []*corev1.Pod{testPod("p-1", "n-lost-1"), testPod("p-2", "n-lost-2")},
			},
			check: func(t *testing.T, h *lifecycleHarness) {
				checkDeleted(t, h, nil)
				checkNode(t, h, "n-lost-1", corev1.ConditionUnknown, "NodeStatusUnknown", unr(tainted))
				checkNode(t, h, "n-lost-2", corev1.ConditionUnknown, "NodeStatusUnknown", unr(now))
				if !h.l.disrupted {
					t.Error("not in full-disruption mode")
				}
			},
		},
		{
			name: "disruption guard: 1 of 4 unreachable evicts",
			world: lifecycleWorld{
				warmAt: past,
				members: []gossip.Member{
					member("a-dead", gossip.StatusDead, "n-lost"),
					member("a-alive", gossip.StatusAlive, "n-1", "n-2", "n-3"),
				},
				nodes: []*corev1.Node{
					testNode("n-lost", unknown, unreachableTaints(tainted)...),
					testNode("n-1", ready), testNode("n-2", ready), testNode("n-3", ready),
				},
				pods: []*corev1.Pod{testPod("p-1", "n-lost"), testPod("p-2", "n-lost")},
			},
			check: func(t *testing.T, h *lifecycleHarness) {
				checkDeleted(t, h, map[string]*int64{"p-1": nil, "p-2": nil})
				if h.l.disrupted {
					t.Error("in full-disruption mode")
				}
			},
		},
		{
			name: "leaving full disruption restamps the NoExecute taints and evicts nothing in that pass",
			world: lifecycleWorld{
				warmAt:    past,
				disrupted: true,
				members: []gossip.Member{
					member("a-dead", gossip.StatusDead, "n-lost"),
					member("a-alive", gossip.StatusAlive, "n-1", "n-2", "n-3"),
				},
				nodes: []*corev1.Node{
					testNode("n-lost", unknown, unreachableTaints(now.Add(-time.Hour))...),
					testNode("n-1", ready), testNode("n-2", ready), testNode("n-3", ready),
				},
				pods: []*corev1.Pod{testPod("p-300", "n-lost", for300)},
			},
			check: func(t *testing.T, h *lifecycleHarness) {
				checkDeleted(t, h, nil)
				checkNode(t, h, "n-lost", corev1.ConditionUnknown, "NodeStatusUnknown", unr(now))
				if h.l.disrupted {
					t.Error("still in full-disruption mode")
				}
			},
		},
		{
			name: "untracked nodes are never modified",
			world: lifecycleWorld{
				warmAt:  past,
				members: []gossip.Member{member("a-alive", gossip.StatusAlive, "n-ok")},
				nodes: []*corev1.Node{
					testNode("n-nothing", unknown, unreachableTaints(tainted)...),
					testNode("n-lease-nil", readyCond(corev1.ConditionFalse, "Whatever")),
					testNode("n-ok", ready),
				},
				leases: []*coordinationv1.Lease{{ObjectMeta: metav1.ObjectMeta{Name: "n-lease-nil", Namespace: corev1.NamespaceNodeLease}}},
				pods:   []*corev1.Pod{testPod("p-1", "n-nothing"), testPod("p-2", "n-lease-nil")},
			},
			check: func(t *testing.T, h *lifecycleHarness) {
				if w := h.writes(); len(w) != 0 {
					t.Errorf("writes: %v", w)
				}
				checkNode(t, h, "n-nothing", corev1.ConditionUnknown, "NodeStatusUnknown", unr(tainted))
				checkNode(t, h, "n-lease-nil", corev1.ConditionFalse, "Whatever", nil)
			},
		},
		{
			name: "orphans: deleted only after the quarantine",
			world: lifecycleWorld{
				warmAt:  past,
				members: []gossip.Member{member("a-alive", gossip.StatusAlive, "n-ok")},
				nodes:   []*corev1.Node{testNode("n-ok", ready)},
				pods:    []*corev1.Pod{testPod("p-orphan", "n-gone"), testPod("p-pending", ""), testPod("p-ok", "n-ok")},
			},
			passes: []time.Time{now, now.Add(20 * time.Second), now.Add(39 * time.Second)},
			check: func(t *testing.T, h *lifecycleHarness) {
				checkDeleted(t, h, nil)
				h.l.reconcile(context.Background(), now.Add(41*time.Second))
				checkDeleted(t, h, map[string]*int64{"p-orphan": i64(0)})
			},
		},
		{
			// Kubernetes' taint eviction on a healthy Node: a user's NoExecute taint (no TimeAdded: counted from
			// when the leader first saw it) evicts pods that do not tolerate it at once and the others when their
			// tolerationSeconds run out.
			name: "a user's NoExecute taint on a healthy node",
			world: lifecycleWorld{
				warmAt:  past,
				members: []gossip.Member{member("a-alive", gossip.StatusAlive, "n-user")},
				nodes: []*corev1.Node{testNode("n-user", ready,
					corev1.Taint{Key: "example.com/evict", Value: "yes", Effect: corev1.TaintEffectNoExecute})},
				pods: []*corev1.Pod{
					testPod("p-intolerant", "n-user"),
					testPod("p-5s", "n-user", corev1.Toleration{Key: "example.com/evict", Operator: corev1.TolerationOpExists,
						Effect: corev1.TaintEffectNoExecute, TolerationSeconds: i64(5)}),
					testPod("p-forever", "n-user", corev1.Toleration{Key: "example.com/evict", Operator: corev1.TolerationOpExists}),
				},
			},
			passes: []time.Time{now, now.Add(3 * time.Second)},
			check: func(t *testing.T, h *lifecycleHarness) {
				checkDeleted(t, h, map[string]*int64{"p-intolerant": nil})
				h.l.reconcile(context.Background(), now.Add(6*time.Second))
				checkDeleted(t, h, map[string]*int64{"p-intolerant": nil, "p-5s": nil})
			},
		},
		{
			name: "terminating pods on a lost node are force-deleted after PodGCTimeout",
			world: lifecycleWorld{
				warmAt:  past,
				members: []gossip.Member{member("a-dead", gossip.StatusDead, "n-lost"), member("a-alive", gossip.StatusAlive, "n-1", "n-2", "n-3")},
				nodes: []*corev1.Node{
					testNode("n-lost", unknown, unreachableTaints(tainted)...),
					testNode("n-1", ready), testNode("n-2", ready), testNode("n-3", ready),
				},
				pods: []*corev1.Pod{
					terminating(testPod("p-stuck", "n-lost", forever), now.Add(-11*time.Minute)),
					terminating(testPod("p-recent", "n-lost", forever), now.Add(-time.Minute)),
					terminating(testPod("p-elsewhere", "n-1"), now.Add(-time.Hour)),
				},
			},
			check: func(t *testing.T, h *lifecycleHarness) {
				checkDeleted(t, h, map[string]*int64{"p-stuck": i64(0)})
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newLifecycleHarness(t, tc.world)
			passes := tc.passes
			if len(passes) == 0 {
				passes = []time.Time{now}
			}
			for _, at := range passes {
				h.l.reconcile(context.Background(), at)
			}
			tc.check(t, h)
		})
	}
}

// A confirmed failure stands for failureRecheck, then the member is probed again; a member that comes back
// alive is forgotten, and probed afresh if it fails again.
// TestQueuedEvictionOfRecoveredNode: an eviction a pass queued runs later, in the background writer; by then
// the Node may have come back and lost its unreachable taint, and its pod stays. The pod of a Node that still
// carries the taint is evicted.
func TestQueuedEvictionOfRecoveredNode(t *testing.T) {
	ready := readyCond(corev1.ConditionTrue, "AgentReady")
	unknown := readyCond(corev1.ConditionUnknown, "NodeStatusUnknown")
	h := newLifecycleHarness(t, lifecycleWorld{
		nodes: []*corev1.Node{testNode("n-back", ready), testNode("n-lost", unknown, unreachableTaints(lifecycleT0)...)},
		pods:  []*corev1.Pod{testPod("p-back", "n-back"), testPod("p-lost", "n-lost")},
	})
	taint := unreachableTaints(lifecycleT0)[1]
	h.l.evict(context.Background(), testPod("p-back", "n-back"), taint)
	h.l.evict(context.Background(), testPod("p-lost", "n-lost"), taint)
	deletes := h.podDeletes()
	if _, ok := deletes["p-back"]; ok {
		t.Error("the pod of the Node that came back was evicted")
	}
	if _, ok := deletes["p-lost"]; !ok {
		t.Error("the pod of the Node still lost was not evicted")
	}
}

func TestConfirmFailuresRechecks(t *testing.T) {
	t0 := time.Date(2026, 11, 24, 3, 0, 0, 0, time.UTC)
	dead := member("a", gossip.StatusDead, "n")
	alive := member("a", gossip.StatusAlive, "n")
	other := member("b", gossip.StatusDead, "m")
	fm := &fakeMembers{reachable: map[string]bool{}}
	l := &lifecycle{c: &Clients{Logger: hclog.NewNullLogger(), Members: fm},
		failureConfirmed: map[string]time.Time{}, answering: map[string]bool{}}
	steps := []struct {
		at         time.Duration
		hosts      []gossip.Member
		reachable  []string
		wantProbes []string
		wantFailed []string
	}{
		{0, []gossip.Member{dead, other}, nil, []string{"a", "b"}, []string{"a", "b"}},
		{5 * time.Second, []gossip.Member{dead, other}, nil, nil, []string{"a", "b"}},
		{failureRecheck, []gossip.Member{dead, other}, []string{"a"}, []string{"a", "b"}, []string{"b"}},
		{failureRecheck + time.Second, []gossip.Member{dead, other}, []string{"a"}, []string{"a"}, []string{"b"}},
		{failureRecheck + 2*time.Second, []gossip.Member{alive, other}, nil, nil, []string{"b"}},
		{failureRecheck + 3*time.Second, []gossip.Member{dead, other}, nil, []string{"a"}, []string{"a", "b"}},
		{failureRecheck + 4*time.Second, []gossip.Member{alive}, nil, nil, nil},
	}
	for i, st := range steps {
		hosts := map[string]*gossip.Member{}
		for _, m := range st.hosts {
			hosts[m.Meta.Nodes[0]] = &m
		}
		fm.reachable = map[string]bool{}
		for _, name := range st.reachable {
			fm.reachable[name] = true
		}
		l.confirmFailures(hosts, t0.Add(st.at))
		if got := fm.takeProbes(); !slices.Equal(got, st.wantProbes) {
			t.Errorf("step %d: probed %v, want %v", i, got, st.wantProbes)
		}
		var failed []string
		for name := range l.failureConfirmed {
			failed = append(failed, name)
		}
		sort.Strings(failed)
		if !slices.Equal(failed, st.wantFailed) {
			t.Errorf("step %d: confirmed failures %v, want %v", i, failed, st.wantFailed)
		}
	}
}
