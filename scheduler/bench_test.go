package scheduler

import (
	"context"
	"flag"
	"fmt"
	"runtime"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

var (
	memNodes = flag.Int("mem.nodes", 5000, "nodes in BenchmarkCacheMemory")
	memPods  = flag.Int("mem.pods", 50000, "bound pods in BenchmarkCacheMemory")
)

func benchNode(i int) *corev1.Node {
	name := fmt.Sprintf("sim-%05d", i)
	alloc := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("32"), corev1.ResourceMemory: resource.MustParse("128Gi"),
		corev1.ResourcePods: resource.MustParse("110")}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(fmt.Sprintf("node-uid-%d", i)), ResourceVersion: "1",
			Labels: map[string]string{corev1.LabelHostname: name, corev1.LabelTopologyZone: fmt.Sprintf("zone-%d", i%3),
				corev1.LabelOSStable: "linux", corev1.LabelArchStable: "amd64"}},
		Status: corev1.NodeStatus{Capacity: alloc, Allocatable: alloc,
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}},
			Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.1"}}},
	}
}

// benchBoundPod is a pod as the informer holds it once bound (managed fields stripped, as Run does).
func benchBoundPod(i int, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("web-%06d", i), Namespace: "default", UID: types.UID(fmt.Sprintf("pod-uid-%d", i)),
			ResourceVersion: "2", Labels: map[string]string{"app": "web", "pod-template-hash": "5d8f7c6b9"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-5d8f7c6b9", UID: "rs-uid"}}},
		Spec: corev1.PodSpec{NodeName: node, SchedulerName: SchedulerName, Containers: []corev1.Container{{
			Name: "web", Image: "registry.local/web:1.0", Ports: []corev1.ContainerPort{{ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodPending, QOSClass: corev1.PodQOSBurstable,
			Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}}},
	}
}

// BenchmarkCacheMemory reports the heap the scheduler holds for -mem.nodes nodes and -mem.pods bound pods:
// the objects as its informers store them plus its cache, and the time of one decision at that size.
func BenchmarkCacheMemory(b *testing.B) {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	s := New(Config{Seed: 1})
	nodes := make([]*corev1.Node, *memNodes)
	pods := make([]*corev1.Pod, *memPods)
	for i := range nodes {
		nodes[i] = benchNode(i)
		s.cache.SetNode(nodes[i])
	}
	for i := range pods {
		pods[i] = benchBoundPod(i, nodes[i%len(nodes)].Name)
		s.cache.SetPod(pods[i])
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	heap := float64(after.HeapAlloc-before.HeapAlloc) / (1 << 20)

	pending := benchBoundPod(-1, "")
	pending.Name, pending.UID = "pending", "pending-uid"
	b.ResetTimer()
	start := time.Now()
	decisions := 0
	for i := 0; i < max(b.N, 200); i++ {
		snap := s.cache.Snapshot()
		if _, fitErr := s.decide(context.Background(), NewPodInfo(pending), snap); fitErr != nil {
			b.Fatal(fitErr)
		}
		snap.Release()
		decisions++
	}
	perDecision := time.Since(start) / time.Duration(decisions)
	b.StopTimer()
	runtime.KeepAlive(nodes)
	runtime.KeepAlive(pods)
	b.ReportMetric(heap, "heap-MiB")
	b.ReportMetric(float64(perDecision.Microseconds()), "µs/decision")
	b.ReportMetric(0, "ns/op")
	b.Logf("%d nodes, %d pods: %.0f MiB of heap (informer objects and cache); one plain decision %v",
		len(nodes), len(pods), heap, perDecision)
}

// BenchmarkDecide times one scheduling decision (filter and score, no API) with 5,000 nodes and 10,000
// bound pods, 2,000 of them with required anti-affinity, for a plain pod, an anti-affinity pod and a pod
// spread over three zones.
func BenchmarkDecide(b *testing.B) {
	s := New(Config{Seed: 1})
	var nodes []*corev1.Node
	for i := 0; i < 5000; i++ {
		nodes = append(nodes, benchNode(i))
		s.cache.SetNode(nodes[i])
	}
	antiTerm := func(group string) *corev1.Affinity {
		return &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
			TopologyKey: corev1.LabelHostname, LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"group": group}}}}}}
	}
	for i := 0; i < 10000; i++ {
		p := benchBoundPod(i, nodes[i%len(nodes)].Name)
		if i%5 == 0 {
			group := fmt.Sprint(i % 10)
			p.Labels["group"] = group
			p.Spec.Affinity = antiTerm(group)
		}
		s.cache.SetPod(p)
	}
	pending := func(mutate func(*corev1.Pod)) *corev1.Pod {
		p := benchBoundPod(-1, "")
		p.Name, p.UID = "pending", "pending-uid"
		if mutate != nil {
			mutate(p)
		}
		return p
	}
	cases := []struct {
		name string
		pod  *corev1.Pod
	}{
		{"plain", pending(nil)},
		{"anti-affinity", pending(func(p *corev1.Pod) { p.Labels["group"] = "3"; p.Spec.Affinity = antiTerm("3") })},
		{"spread-3-zones", pending(func(p *corev1.Pod) {
			p.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: corev1.LabelTopologyZone,
				WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}}}}
		})},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				snap := s.cache.Snapshot()
				if _, fitErr := s.decide(context.Background(), NewPodInfo(c.pod), snap); fitErr != nil {
					b.Fatal(fitErr)
				}
				snap.Release()
			}
		})
	}
}
