package bench

import (
	"context"
	"flag"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/skiff-dev/skiff/fsm"
	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/raftnode"
)

var (
	schedNodes        = flag.Int("sched.nodes", 5000, "simulated nodes in the scheduler benchmark")
	schedPods         = flag.Int("sched.pods", 10000, "pending pods with plain requests in the scheduler benchmark")
	schedAffinityPods = flag.Int("sched.affinity-pods", 2000, "pods in each of the anti-affinity and topology-spread rows")
)

// BenchmarkScheduler measures, on three `skiff server` processes with simulated nodes registered through the
// API, how fast the leader's scheduler binds pods created at concurrency 64:
//   - plain requests (-sched.pods), then required pod anti-affinity per hostname, then topology spread over
//     three zones (-sched.affinity-pods each);
//   - pods bound per second (from the first create to the last bind) and the p99 from a create's
//     acknowledgement to the bind's arrival at an informer;
//   - the raw store write rate in the same run, and the ratio.
//
// Run it with -benchtime=1x; the sizes are flags.
func BenchmarkScheduler(b *testing.B) {
	c, clients := apiCluster(b)
	ctx := context.Background()
	t0 := time.Now()
	run(b, 64, *schedNodes, func(w, i int) error {
		_, err := clients[w%3].CoreV1().Nodes().Create(ctx, simNode(i), metav1.CreateOptions{})
		return err
	})
	b.Logf("%d nodes registered in %v", *schedNodes, time.Since(t0).Round(time.Millisecond))

	rows := []struct {
		name string
		pods int
		pod  func(i int) *corev1.Pod
	}{
		{"plain", *schedPods, func(i int) *corev1.Pod { return schedPod(i, "plain", nil) }},
		{"anti-affinity", *schedAffinityPods, func(i int) *corev1.Pod {
			group := fmt.Sprint(i % 10) // ten groups, each at most one pod per node
			return schedPod(i, "anti", func(p *corev1.Pod) {
				p.Labels["group"] = group
				p.Spec.Affinity = &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{
					RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{TopologyKey: corev1.LabelHostname,
						LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"group": group}}}}}}
			})
		}},
		{"spread-3-zones", *schedAffinityPods, func(i int) *corev1.Pod {
			return schedPod(i, "spread", func(p *corev1.Pod) {
				p.Spec.TopologySpreadConstraints = []corev1.TopologySpreadConstraint{{MaxSkew: 1, TopologyKey: corev1.LabelTopologyZone,
					WhenUnsatisfiable: corev1.DoNotSchedule, LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "spread"}}}}
			})
		}},
	}
	b.ResetTimer()
	for _, row := range rows {
		ns := "sched-" + row.name
		createNamespace(b, ctx, clients[0], ns)
		cpu := startCPU(b, c)
		profiled := profileServers(b, clients, row.name, 10*time.Second)
		rate, p50, p99 := measureBinding(b, clients, ns, row.pods, row.pod)
		clientMs, serversMs := cpu.perOp(row.pods)
		profiled()
		b.ReportMetric(rate, row.name+"-pods-bound/s")
		b.ReportMetric(serversMs, row.name+"-server-cpu-ms/pod")
		b.ReportMetric(clientMs, row.name+"-client-cpu-ms/pod")
		b.ReportMetric(ms(p99), row.name+"-p99-ms")
		b.Logf("%s: %d pods bound at %.0f/s, create-to-bound p50 %.0f ms, p99 %.0f ms", row.name, row.pods, rate, ms(p50), ms(p99))
		if row.name == "plain" {
			cpu := startCPU(b, c)
			rawRate := rawWrites(b, row.pods, c.Procs...)
			rawClientMs, rawServersMs := cpu.perOp(row.pods)
			b.ReportMetric(rawRate, "raw-writes/s")
			b.ReportMetric(rawServersMs+rawClientMs, "raw-cpu-ms/write")
			b.ReportMetric(rate/rawRate, "bound/raw")
			b.Logf("raw store writes in the same run: %.0f/s; scheduling/raw %.2f", rawRate, rate/rawRate)
		}
	}
	b.ReportMetric(0, "ns/op")
}

func simNode(i int) *corev1.Node {
	name := fmt.Sprintf("sim-%05d", i)
	alloc := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("4"), corev1.ResourceMemory: resource.MustParse("8Gi"),
		corev1.ResourcePods: resource.MustParse("110")}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelHostname: name,
			corev1.LabelTopologyZone: fmt.Sprintf("zone-%d", i%3)}},
		Status: corev1.NodeStatus{Capacity: alloc, Allocatable: alloc,
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}},
	}
}

func schedPod(i int, app string, mutate func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%06d", i), Labels: map[string]string{"app": app}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "registry.local/bench:1.0",
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("16Mi")}}}}},
	}
	if mutate != nil {
		mutate(p)
	}
	return p
}

// measureBinding creates n pods at concurrency 64 and waits, through an informer, until all are bound.
func measureBinding(b *testing.B, clients []kubernetes.Interface, ns string, n int, newPod func(int) *corev1.Pod) (float64, time.Duration, time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	created := make(map[string]time.Time, n)
	bound := make(map[string]time.Time, n)
	allBound := make(chan struct{})
	onPod := func(obj any) {
		p, ok := obj.(*corev1.Pod)
		if !ok || p.Spec.NodeName == "" {
			return
		}
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		if _, seen := bound[p.Name]; !seen {
			bound[p.Name] = now
			if len(bound) == n {
				close(allBound)
			}
		}
	}
	factory := informers.NewSharedInformerFactoryWithOptions(clients[1], 0, informers.WithNamespace(ns))
	inf := factory.Core().V1().Pods().Informer()
	inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: onPod, UpdateFunc: func(_, o any) { onPod(o) }})
	factory.Start(ctx.Done())
	defer func() { cancel(); factory.Shutdown() }() // Shutdown waits for the informer, which stops on cancel
	cache.WaitForCacheSync(ctx.Done(), inf.HasSynced)

	start := time.Now()
	run(b, 64, n, func(w, i int) error {
		p := newPod(i)
		_, err := clients[w%3].CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		mu.Lock()
		created[p.Name] = time.Now()
		mu.Unlock()
		return err
	})
	select {
	case <-allBound:
	case <-time.After(10 * time.Minute):
		mu.Lock()
		defer mu.Unlock()
		b.Fatalf("%s: %d of %d pods bound after 10 minutes", ns, len(bound), n)
	}
	mu.Lock()
	defer mu.Unlock()
	var last time.Time
	var lat []time.Duration
	for name, at := range bound {
		if at.After(last) {
			last = at
		}
		// The create's acknowledgement can arrive after the informer saw the bind; count that as 0.
		lat = append(lat, max(0, at.Sub(created[name])))
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return float64(n) / last.Sub(start).Seconds(), lat[(len(lat)-1)/2], lat[(len(lat)-1)*99/100]
}

// rawWrites measures raw store creates of a bound pod's size through the three peers' internal RPC.
func rawWrites(b *testing.B, n int, procs ...*proctest.Proc) float64 {
	ctx := context.Background()
	clients := make([]*raftnode.Client, len(procs))
	for i, p := range procs {
		clients[i] = p.RaftClient(b)
		defer clients[i].Close()
	}
	value := make([]byte, schedPod(0, "plain", nil).Size()+120) // with nodeName and the PodScheduled condition
	rate, _, _ := run(b, 64, n, func(w, i int) error {
		res, err := clients[w%len(clients)].Apply(ctx, &fsm.Command{Type: fsm.CmdCreate, Key: fmt.Sprintf("/bench/sched-raw/%06d", i), Value: value})
		if err == nil {
			err = res.Err()
		}
		return err
	})
	return rate
}
