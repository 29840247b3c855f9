package controller

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	appslisters "k8s.io/client-go/listers/apps/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	kubecontroller "k8s.io/kubernetes/pkg/controller"
)

var rankNow = time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)

// rankPod builds a pod for the ranking tests; each option changes one attribute.
func rankPod(name string, opts ...func(*corev1.Pod)) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID("uid-" + name),
			CreationTimestamp: metav1.NewTime(rankNow.Add(-time.Hour))},
		Spec:   corev1.PodSpec{NodeName: "node-a"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for _, o := range opts {
		o(pod)
	}
	return pod
}

func unscheduled(p *corev1.Pod) { p.Spec.NodeName = "" }

func onNode(node string) func(*corev1.Pod) { return func(p *corev1.Pod) { p.Spec.NodeName = node } }

func inPhase(phase corev1.PodPhase) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Status.Phase = phase }
}

func readyFor(d time.Duration) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{Type: corev1.PodReady,
			Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(rankNow.Add(-d))})
	}
}

func withRestarts(n int32) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: "c", RestartCount: n})
	}
}

func withSidecarRestarts(n int32) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		always := corev1.ContainerRestartPolicyAlways
		p.Spec.InitContainers = append(p.Spec.InitContainers, corev1.Container{Name: "sidecar", RestartPolicy: &always})
		p.Status.InitContainerStatuses = append(p.Status.InitContainerStatuses, corev1.ContainerStatus{Name: "sidecar", RestartCount: n})
	}
}

func withCost(cost string) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Annotations = map[string]string{podDeletionCostAnnotation: cost} }
}

func createdAgo(d time.Duration) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.CreationTimestamp = metav1.NewTime(rankNow.Add(-d)) }
}

func withUID(uid string) func(*corev1.Pod) { return func(p *corev1.Pod) { p.UID = types.UID(uid) } }

// TestRankForDeletion: each case is a pair where "first" must be deleted before "second", whichever order
// they come in, and the ranking must not say the opposite.
func TestRankForDeletion(t *testing.T) {
	cases := []struct {
		name          string
		first, second *corev1.Pod
		related       []*corev1.Pod // pods counted per node; none unless given
	}{
		{name: "unscheduled before scheduled",
			first: rankPod("a", unscheduled, inPhase(corev1.PodPending)), second: rankPod("b", inPhase(corev1.PodPending))},
		{name: "unscheduled beats every later criterion",
			first: rankPod("a", unscheduled, readyFor(time.Hour), withCost("100")), second: rankPod("b", inPhase(corev1.PodPending))},
		{name: "pending before unknown",
			first: rankPod("a", inPhase(corev1.PodPending)), second: rankPod("b", inPhase(corev1.PodUnknown))},
		{name: "unknown before running",
			first: rankPod("a", inPhase(corev1.PodUnknown)), second: rankPod("b")},
		{name: "pending before running even when ready",
			first: rankPod("a", inPhase(corev1.PodPending), readyFor(time.Hour)), second: rankPod("b")},
		{name: "not ready before ready",
			first: rankPod("a"), second: rankPod("b", readyFor(time.Minute))},
		{name: "not ready beats restarts",
			first: rankPod("a"), second: rankPod("b", readyFor(time.Minute), withRestarts(9))},
		{name: "lower deletion cost first",
			first: rankPod("a", withCost("-5")), second: rankPod("b")},
		{name: "deletion cost beats age",
			first: rankPod("a", withCost("1"), createdAgo(48*time.Hour)), second: rankPod("b", withCost("2"), createdAgo(time.Minute))},
		{name: "malformed deletion cost counts as zero",
			first: rankPod("a", withCost("-1")), second: rankPod("b", withCost("lots"))},
		{name: "node with more related pods first",
			first: rankPod("a", onNode("crowded")), second: rankPod("b", onNode("quiet")),
			related: []*corev1.Pod{rankPod("r1", onNode("crowded")), rankPod("r2", onNode("crowded")), rankPod("r3", onNode("quiet"))}},
		{name: "finished related pods do not crowd a node",
			first: rankPod("a", onNode("busy")), second: rankPod("b", onNode("crowded")),
			related: []*corev1.Pod{rankPod("r1", onNode("crowded"), inPhase(corev1.PodSucceeded)),
				rankPod("r2", onNode("crowded"), inPhase(corev1.PodFailed)), rankPod("r3", onNode("busy"))}},
		{name: "ready for less time first",
			first: rankPod("a", readyFor(time.Minute)), second: rankPod("b", readyFor(time.Hour))},
		{name: "ready time beats restarts",
			first: rankPod("a", readyFor(time.Minute)), second: rankPod("b", readyFor(time.Hour), withRestarts(5))},
		{name: "ready times in one power-of-two bucket tie, broken by UID",
			first: rankPod("z", withUID("1"), readyFor(100*time.Second)), second: rankPod("y", withUID("2"), readyFor(101*time.Second))},
		{name: "more restarts first",
			first: rankPod("a", withRestarts(3)), second: rankPod("b", withRestarts(1))},
		{name: "restarts beat age",
			first: rankPod("a", withRestarts(1), createdAgo(48*time.Hour)), second: rankPod("b", createdAgo(time.Minute))},
		{name: "more sidecar restarts first when regular restarts tie",
			first: rankPod("a", withRestarts(1), withSidecarRestarts(4)), second: rankPod("b", withRestarts(1), withSidecarRestarts(0))},
		{name: "regular restarts beat sidecar restarts",
			first: rankPod("a", withRestarts(2)), second: rankPod("b", withRestarts(1), withSidecarRestarts(9))},
		{name: "newer first",
			first: rankPod("a", createdAgo(time.Minute)), second: rankPod("b", createdAgo(time.Hour))},
		{name: "no creation time counts as newest",
			first: rankPod("a", createdAgo(0), func(p *corev1.Pod) { p.CreationTimestamp = metav1.Time{} }), second: rankPod("b", createdAgo(time.Second))},
		{name: "creation times in one power-of-two bucket tie, broken by UID",
			first: rankPod("old", withUID("1"), createdAgo(101*time.Second)), second: rankPod("new", withUID("2"), createdAgo(100*time.Second))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, order := range [][]*corev1.Pod{{tc.first, tc.second}, {tc.second, tc.first}} {
				got := rankForDeletion(order, tc.related, rankNow)
				if got[0] != tc.first {
					t.Errorf("ranked %s before %s", got[0].Name, got[1].Name)
				}
			}
			first := rankedPod{pod: tc.first, podsOnNode: countOnNode(tc.related, tc.first.Spec.NodeName)}
			second := rankedPod{pod: tc.second, podsOnNode: countOnNode(tc.related, tc.second.Spec.NodeName)}
			if deleteFirst(second, first, rankNow) {
				t.Errorf("deleteFirst says %s goes before %s too", tc.second.Name, tc.first.Name)
			}
		})
	}
}

func countOnNode(pods []*corev1.Pod, node string) int {
	n := 0
	for _, p := range pods {
		if isPodActive(p) && p.Spec.NodeName == node {
			n++
		}
	}
	return n
}

// TestRankPodsToDelete: a mixed set is taken in full ranking order, and only as many as asked.
func TestRankPodsToDelete(t *testing.T) {
	pods := []*corev1.Pod{
		rankPod("ready-old", readyFor(24*time.Hour), createdAgo(48*time.Hour)),
		rankPod("ready-new", readyFor(time.Minute), createdAgo(2*time.Minute)),
		rankPod("running-not-ready", createdAgo(time.Hour)),
		rankPod("running-restarting", withRestarts(7), createdAgo(time.Hour)),
		rankPod("pending", inPhase(corev1.PodPending)),
		rankPod("unscheduled", unscheduled, inPhase(corev1.PodPending)),
		rankPod("unknown", inPhase(corev1.PodUnknown)),
	}
	want := []string{"unscheduled", "pending", "unknown", "running-restarting", "running-not-ready", "ready-new", "ready-old"}
	cases := []struct {
		name string
		n    int
		want []string
	}{
		{"one", 1, want[:1]},
		{"three", 3, want[:3]},
		{"all but one", len(pods) - 1, want[:len(pods)-1]},
		{"all", len(pods), nil}, // every pod goes: order does not matter
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			shuffled := slices.Clone(pods)
			slices.Reverse(shuffled)
			got := podsToDelete(shuffled, nil, tc.n, rankNow)
			if len(got) != tc.n {
				t.Fatalf("got %d pods, want %d", len(got), tc.n)
			}
			if tc.want == nil {
				return
			}
			var names []string
			for _, p := range got {
				names = append(names, p.Name)
			}
			if !slices.Equal(names, tc.want) {
				t.Errorf("deleting %v, want %v", names, tc.want)
			}
		})
	}
}

// TestSlowStartBatch: batches of 1, 2, 4, ... (capped by what remains), stopping after the first batch
// with a failure. The number of calls made shows where it stopped.
func TestSlowStartBatch(t *testing.T) {
	cases := []struct {
		name          string
		count         int
		initial       int
		failCalls     []int // 1-based call numbers that fail
		wantCalls     int
		wantSuccesses int
		wantErr       bool
	}{
		{name: "nothing to do", count: 0, initial: 1},
		{name: "one", count: 1, initial: 1, wantCalls: 1, wantSuccesses: 1},
		{name: "all succeed: 1+2+4+3", count: 10, initial: 1, wantCalls: 10, wantSuccesses: 10},
		{name: "first call fails: nothing more is tried", count: 10, initial: 1, failCalls: []int{1}, wantCalls: 1, wantErr: true},
		{name: "failure in the second batch (calls 2-3) stops there", count: 10, initial: 1, failCalls: []int{3}, wantCalls: 3, wantSuccesses: 2, wantErr: true},
		{name: "failure in the third batch (calls 4-7) stops there", count: 10, initial: 1, failCalls: []int{5}, wantCalls: 7, wantSuccesses: 6, wantErr: true},
		{name: "two failures in one batch", count: 10, initial: 1, failCalls: []int{4, 7}, wantCalls: 7, wantSuccesses: 5, wantErr: true},
		{name: "failure in the last, short batch (calls 8-10)", count: 10, initial: 1, failCalls: []int{10}, wantCalls: 10, wantSuccesses: 9, wantErr: true},
		{name: "initial batch larger than the count", count: 3, initial: 5, wantCalls: 3, wantSuccesses: 3},
		{name: "initial batch of 2: 2+4+8+1", count: 15, initial: 2, failCalls: []int{15}, wantCalls: 15, wantSuccesses: 14, wantErr: true},
		{name: "burst cap", count: burstReplicas, initial: 1, wantCalls: burstReplicas, wantSuccesses: burstReplicas},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int32
			successes, err := slowStartBatch(tc.count, tc.initial, func() error {
				if slices.Contains(tc.failCalls, int(calls.Add(1))) {
					return errors.New("refused")
				}
				return nil
			})
			if int(calls.Load()) != tc.wantCalls || successes != tc.wantSuccesses || (err != nil) != tc.wantErr {
				t.Errorf("calls %d, successes %d, err %v; want %d, %d, error %v", calls.Load(), successes, err, tc.wantCalls, tc.wantSuccesses, tc.wantErr)
			}
		})
	}
}

// TestSlowStartBatchSizes: the calls of a batch run together, and a batch starts only after the previous
// one ended.
func TestSlowStartBatchSizes(t *testing.T) {
	var mu sync.Mutex
	inFlight, peak := 0, 0
	var peaks []int
	release := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		slowStartBatch(15, 1, func() error {
			mu.Lock()
			inFlight++
			peak = max(peak, inFlight)
			mu.Unlock()
			<-release
			mu.Lock()
			inFlight--
			if inFlight == 0 {
				peaks, peak = append(peaks, peak), 0
			}
			mu.Unlock()
			return nil
		})
	}()
	want := []int{1, 2, 4, 8}
	for _, size := range want {
		deadline := time.Now().Add(5 * time.Second)
		for {
			mu.Lock()
			n := inFlight
			mu.Unlock()
			if n == size {
				break
			}
			if n > size || time.Now().After(deadline) {
				t.Fatalf("batch of %d calls in flight, want %d", n, size)
			}
			time.Sleep(time.Millisecond)
		}
		for range size {
			release <- struct{}{}
		}
	}
	<-done
	if !slices.Equal(peaks, want) {
		t.Errorf("batches %v, want %v", peaks, want)
	}
}

func TestReplicaSetExpectations(t *testing.T) {
	now := time.Now()
	cases := []struct {
		name string
		act  func(e *expectations)
		at   time.Time
		want bool
	}{
		{"nothing expected", func(e *expectations) {}, now, true},
		{"creates pending", func(e *expectations) { e.expectCreations("ns/rs", 2); e.creationObserved("ns/rs") }, now, false},
		{"creates all seen", func(e *expectations) {
			e.expectCreations("ns/rs", 2)
			e.creationObserved("ns/rs")
			e.creationObserved("ns/rs")
		}, now, true},
		{"more adds seen than expected", func(e *expectations) {
			e.expectCreations("ns/rs", 1)
			e.creationObserved("ns/rs")
			e.creationObserved("ns/rs")
		}, now, true},
		{"another replicaset's adds do not count", func(e *expectations) { e.expectCreations("ns/rs", 1); e.creationObserved("ns/other") }, now, false},
		{"deletes pending", func(e *expectations) {
			e.expectDeletions("ns/rs", []string{"ns/a", "ns/b"})
			e.deletionObserved("ns/rs", "ns/a")
		}, now, false},
		{"a delete seen twice counts once", func(e *expectations) {
			e.expectDeletions("ns/rs", []string{"ns/a", "ns/b"})
			e.deletionObserved("ns/rs", "ns/a")
			e.deletionObserved("ns/rs", "ns/a")
		}, now, false},
		{"an unexpected pod's delete does not count", func(e *expectations) {
			e.expectDeletions("ns/rs", []string{"ns/a"})
			e.deletionObserved("ns/rs", "ns/x")
		}, now, false},
		{"deletes all seen", func(e *expectations) {
			e.expectDeletions("ns/rs", []string{"ns/a", "ns/b"})
			e.deletionObserved("ns/rs", "ns/b")
			e.deletionObserved("ns/rs", "ns/a")
		}, now, true},
		{"expired", func(e *expectations) { e.expectCreations("ns/rs", 3) }, now.Add(expectationsTimeout + time.Second), true},
		{"not yet expired", func(e *expectations) { e.expectCreations("ns/rs", 3) }, now.Add(expectationsTimeout - time.Second), false},
		{"forgotten", func(e *expectations) { e.expectCreations("ns/rs", 3); e.forget("ns/rs") }, now, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newExpectations()
			tc.act(e)
			if got := e.satisfied("ns/rs", tc.at); got != tc.want {
				t.Errorf("satisfied = %v, want %v", got, tc.want)
			}
		})
	}
}

func testReplicaSet(replicas int32) *appsv1.ReplicaSet {
	return &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "rs-uid", Generation: 4},
		Spec: appsv1.ReplicaSetSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "web", "tier": "front"},
					Annotations: map[string]string{"note": "x"}, Finalizers: []string{"example.com/keep"}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "nginx"}}},
			},
		},
	}
}

func TestReplicaSetStatus(t *testing.T) {
	rs := testReplicaSet(3)
	rs.Spec.MinReadySeconds = 60
	pods := []*corev1.Pod{
		rankPod("available", readyFor(2*time.Minute), func(p *corev1.Pod) { p.Labels = map[string]string{"app": "web", "tier": "front"} }),
		rankPod("ready-too-recently", readyFor(10*time.Second), func(p *corev1.Pod) { p.Labels = map[string]string{"app": "web", "tier": "front"} }),
		rankPod("partly-labelled", func(p *corev1.Pod) { p.Labels = map[string]string{"app": "web"} }),
	}
	status := replicaSetStatus(rs, pods, pods[:1], nil, rankNow)
	if status.Replicas != 3 || status.FullyLabeledReplicas != 2 || status.ReadyReplicas != 2 || status.AvailableReplicas != 1 ||
		status.TerminatingReplicas == nil || *status.TerminatingReplicas != 1 || len(status.Conditions) != 0 {
		t.Errorf("status %+v", status)
	}
	if wait := untilNextAvailable(pods, rs.Spec.MinReadySeconds, rankNow); wait < 50*time.Second || wait > 51*time.Second {
		t.Errorf("look again in %v, want about 50s", wait)
	}

	failed := replicaSetStatus(rs, pods[:1], nil, errors.New("quota exceeded"), rankNow)
	if len(failed.Conditions) != 1 || failed.Conditions[0].Type != appsv1.ReplicaSetReplicaFailure ||
		failed.Conditions[0].Reason != "FailedCreate" || failed.Conditions[0].Message != "quota exceeded" {
		t.Fatalf("conditions after a failed create: %+v", failed.Conditions)
	}
	rs.Status = failed
	if again := replicaSetStatus(rs, pods[:1], nil, errors.New("another"), rankNow.Add(time.Minute)); !again.Conditions[0].LastTransitionTime.Equal(&failed.Conditions[0].LastTransitionTime) {
		t.Errorf("a standing failure was re-stamped: %+v", again.Conditions)
	}
	if len(rs.Status.Conditions) != 1 {
		t.Fatalf("computing the status changed the ReplicaSet's")
	}
	if cleared := replicaSetStatus(rs, pods, nil, nil, rankNow); len(cleared.Conditions) != 0 {
		t.Errorf("conditions after success: %+v", cleared.Conditions)
	}
	tooMany := replicaSetStatus(testReplicaSet(1), pods, nil, errors.New("refused"), rankNow)
	if tooMany.Conditions[0].Reason != "FailedDelete" {
		t.Errorf("reason %q after a failed delete", tooMany.Conditions[0].Reason)
	}
}

func TestReplicaSetPodFromTemplate(t *testing.T) {
	pod := podFromTemplate(testReplicaSet(1))
	ref := metav1.GetControllerOf(pod)
	if pod.GenerateName != "web-" || pod.Name != "" || pod.Namespace != "default" || pod.Labels["tier"] != "front" ||
		pod.Annotations["note"] != "x" || !slices.Equal(pod.Finalizers, []string{"example.com/keep"}) || len(pod.Spec.Containers) != 1 {
		t.Errorf("pod %+v", pod.ObjectMeta)
	}
	if ref == nil || ref.APIVersion != "apps/v1" || ref.Kind != "ReplicaSet" || ref.Name != "web" || ref.UID != "rs-uid" ||
		ref.BlockOwnerDeletion == nil || !*ref.BlockOwnerDeletion {
		t.Errorf("controller reference %+v", ref)
	}
	long := testReplicaSet(1)
	long.Name = strings.Repeat("a", 253)
	if got := podFromTemplate(long).GenerateName; got != long.Name+"-" {
		t.Errorf("the longest name: generateName %q, want the name and a dash (the API server shortens it)", got)
	}
}

func TestReplicaSetSelector(t *testing.T) {
	cases := []struct {
		name    string
		mutate  func(*appsv1.ReplicaSet)
		wantErr bool
	}{
		{"matches the template", func(*appsv1.ReplicaSet) {}, false},
		{"missing", func(rs *appsv1.ReplicaSet) { rs.Spec.Selector = nil }, true},
		{"empty selects everything", func(rs *appsv1.ReplicaSet) { rs.Spec.Selector = &metav1.LabelSelector{} }, true},
		{"does not match the template", func(rs *appsv1.ReplicaSet) { rs.Spec.Selector.MatchLabels = map[string]string{"app": "db"} }, true},
		{"invalid", func(rs *appsv1.ReplicaSet) {
			rs.Spec.Selector.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Near"}}
		}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rs := testReplicaSet(1)
			tc.mutate(rs)
			if _, err := replicaSetSelector(rs); (err != nil) != tc.wantErr {
				t.Errorf("err %v, want error %v", err, tc.wantErr)
			}
		})
	}
}

// replicaSetHarness is a controller on a fake clientset, with listers filled by hand.
type replicaSetHarness struct {
	kube     *fake.Clientset
	r        *replicaSetController
	pods     cache.Indexer
	recorder *record.FakeRecorder
}

func newReplicaSetHarness(t *testing.T, rs *appsv1.ReplicaSet, pods ...*corev1.Pod) *replicaSetHarness {
	t.Helper()
	rsIdx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	podIdx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc,
		// as kubecontroller.AddPodControllerIndexer indexes the shared informer's pods
		kubecontroller.PodControllerIndex: func(obj any) ([]string, error) {
			pod := obj.(*corev1.Pod)
			return []string{kubecontroller.PodControllerIndexKey(pod.Namespace, metav1.GetControllerOf(pod))}, nil
		}})
	objs := []runtime.Object{rs.DeepCopy()}
	if err := rsIdx.Add(rs); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods {
		objs = append(objs, p.DeepCopy())
		if err := podIdx.Add(p); err != nil {
			t.Fatal(err)
		}
	}
	kube := fake.NewClientset(objs...)
	var created atomic.Int32
	kube.PrependReactor("create", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		pod := action.(k8stesting.CreateAction).GetObject().(*corev1.Pod)
		if pod.Name == "" { // the fake does not generate names
			pod.Name = fmt.Sprintf("%s%d", pod.GenerateName, created.Add(1))
		}
		return false, nil, nil
	})
	rec := record.NewFakeRecorder(1000)
	r := &replicaSetController{
		kube: kube, replicaSets: appslisters.NewReplicaSetLister(rsIdx), pods: corelisters.NewPodLister(podIdx),
		podIndex: podIdx, expectations: newExpectations(), recorder: rec, logger: hclog.NewNullLogger(),
	}
	r.queue = newKeyQueue(queueConfig{what: "replicaset", sync: r.sync})
	t.Cleanup(r.queue.shutDown)
	return &replicaSetHarness{kube: kube, pods: podIdx, recorder: rec, r: r}
}

func (h *replicaSetHarness) actions(verb string) int {
	n := 0
	for _, a := range h.kube.Actions() {
		if a.GetVerb() == verb && a.GetResource().Resource == "pods" {
			n++
		}
	}
	return n
}

func ownedPod(name string, rs *appsv1.ReplicaSet, opts ...func(*corev1.Pod)) *corev1.Pod {
	pod := rankPod(name, opts...)
	pod.Labels = map[string]string{"app": "web", "tier": "front"}
	pod.OwnerReferences = []metav1.OwnerReference{*metav1.NewControllerRef(rs, replicaSetKind)}
	return pod
}

// TestReplicaSetSyncCreatesOnceUntilObserved: a sync creates the missing pods (at most burstReplicas),
// and a second sync before the informer reports them creates nothing.
func TestReplicaSetSyncCreatesOnceUntilObserved(t *testing.T) {
	rs := testReplicaSet(burstReplicas + 100)
	h := newReplicaSetHarness(t, rs)
	if _, err := h.r.sync(context.Background(), "default/web"); err != nil {
		t.Fatal(err)
	}
	if got := h.actions("create"); got != burstReplicas {
		t.Fatalf("%d creates, want %d", got, burstReplicas)
	}
	if h.r.expectations.satisfied("default/web", time.Now()) {
		t.Fatalf("expectations satisfied before the informer saw any pod")
	}
	recheck, err := h.r.sync(context.Background(), "default/web")
	if err != nil {
		t.Fatal(err)
	}
	if got := h.actions("create"); got != burstReplicas {
		t.Fatalf("a second sync created again: %d creates", got)
	}
	// No event may come to end the wait, so the sync asks to be run again when it runs out.
	if recheck <= expectationsTimeout-time.Minute || recheck > expectationsTimeout {
		t.Errorf("a sync waiting on expectations asks to look again in %v, want about %v", recheck, expectationsTimeout)
	}
	stored, err := h.kube.AppsV1().ReplicaSets("default").Get(context.Background(), "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if stored.Status.ObservedGeneration != 4 || stored.Status.Replicas != 0 {
		t.Errorf("status %+v", stored.Status)
	}
	for range burstReplicas {
		h.r.expectations.creationObserved("default/web")
	}
	if !h.r.expectations.satisfied("default/web", time.Now()) {
		t.Errorf("expectations unsatisfied after every create was seen")
	}
}

// TestReplicaSetSyncCreateFailure: the first refused create ends the sync with an error, the expectation
// is lowered so the retry may act, and the failure shows as an event and a ReplicaFailure condition.
func TestReplicaSetSyncCreateFailure(t *testing.T) {
	h := newReplicaSetHarness(t, testReplicaSet(5))
	h.kube.PrependReactor("create", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("admission says no")
	})
	if _, err := h.r.sync(context.Background(), "default/web"); err == nil {
		t.Fatal("sync succeeded")
	}
	if got := h.actions("create"); got != 1 {
		t.Errorf("%d creates after the first failed, want 1 (slow start)", got)
	}
	if !h.r.expectations.satisfied("default/web", time.Now()) {
		t.Errorf("refused creates are still expected")
	}
	if ev := <-h.recorder.Events; !strings.HasPrefix(ev, "Warning FailedCreate Error creating: admission says no") {
		t.Errorf("event %q", ev)
	}
	stored, err := h.kube.AppsV1().ReplicaSets("default").Get(context.Background(), "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c := stored.Status.Conditions; len(c) != 1 || c[0].Type != appsv1.ReplicaSetReplicaFailure || c[0].Reason != "FailedCreate" {
		t.Errorf("conditions %+v", c)
	}
}

// TestReplicaSetSyncDeletesSurplus: the least valuable pods go, a pod already gone counts as deleted, and
// expectations wait only for the deletes the informer will report.
func TestReplicaSetSyncDeletesSurplus(t *testing.T) {
	rs := testReplicaSet(1)
	keep := ownedPod("keep", rs, readyFor(time.Hour))
	pending := ownedPod("pending", rs, inPhase(corev1.PodPending))
	gone := ownedPod("gone", rs, unscheduled, inPhase(corev1.PodPending))
	h := newReplicaSetHarness(t, rs, keep, pending)
	if err := h.pods.Add(gone); err != nil { // in the cache, no longer in the API
		t.Fatal(err)
	}
	if _, err := h.r.sync(context.Background(), "default/web"); err != nil {
		t.Fatal(err)
	}
	var deleted []string
	for _, a := range h.kube.Actions() {
		if d, ok := a.(k8stesting.DeleteAction); ok && d.GetResource().Resource == "pods" {
			deleted = append(deleted, d.GetName())
		}
	}
	slices.Sort(deleted)
	if !slices.Equal(deleted, []string{"gone", "pending"}) {
		t.Fatalf("deleted %v", deleted)
	}
	if h.r.expectations.satisfied("default/web", time.Now()) {
		t.Errorf("satisfied before the informer reported the delete of pending")
	}
	h.r.expectations.deletionObserved("default/web", "default/pending")
	if !h.r.expectations.satisfied("default/web", time.Now()) {
		t.Errorf("still waiting after every delete was reported")
	}
}
