package bench

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
)

// BenchmarkCacheLag measures, on three `skiff server` processes, how long after a write is acknowledged each
// server's watch cache has it: the lag that admission and every informer-fed decision of a server sees (a pod
// created through a follower just after its namespace got `pod-security.kubernetes.io/enforce` is admitted
// against the label only once that server has the label). b.N label changes of one namespace, through a
// follower, 20 ms apart; a watch on the namespace through each server notes when each change arrives. The lag
// is arrival minus the writer's acknowledgement, p50 and p99, for the leader and for the followers (the
// writing one included), and the followers' p99 less the leader's. Before the writes, the three servers'
// CPU over 5 s of no requests: what keeping followers current costs an idle cluster.
func BenchmarkCacheLag(b *testing.B) {
	if firstCallOfTwo(b) {
		return
	}
	c, clients := apiCluster(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leaderName := c.HealthyPeers(c.Procs[0], 3)
	const ns = "bench-cache-lag"
	createNamespace(b, ctx, clients[0], ns)
	const idleFor = 5 * time.Second
	idle := startCPU(b, c)
	time.Sleep(idleFor)
	_, idleMs := idle.perOp(1)
	idlePercent := idleMs / float64(idleFor/time.Millisecond) * 100

	// arrivals[server][resourceVersion] is when that server's watch delivered the change.
	var mu sync.Mutex
	arrivals := make([]map[string]time.Time, len(clients))
	for i, client := range clients {
		arrivals[i] = map[string]time.Time{}
		current, err := client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if err != nil {
			b.Fatal(err)
		}
		w, err := client.CoreV1().Namespaces().Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + ns, ResourceVersion: current.ResourceVersion})
		if err != nil {
			b.Fatal(err)
		}
		go func() {
			for ev := range w.ResultChan() {
				if ev.Type != watch.Modified {
					continue
				}
				at := time.Now()
				mu.Lock()
				arrivals[i][ev.Object.(*corev1.Namespace).ResourceVersion] = at
				mu.Unlock()
			}
		}()
	}
	writer := -1
	for i, p := range c.Procs {
		if p.Name != leaderName && writer < 0 {
			writer = i
		}
	}

	var leaderLags, followerLags []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		patch := fmt.Sprintf(`{"metadata":{"labels":{"bench-round":"%d"}}}`, i)
		updated, err := clients[writer].CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		if err != nil {
			b.Fatal(err)
		}
		acked := time.Now()
		rv := updated.ResourceVersion
		deadline := time.Now().Add(10 * time.Second)
		for {
			mu.Lock()
			var seen []time.Time
			for s := range clients {
				if at, ok := arrivals[s][rv]; ok {
					seen = append(seen, at)
				}
			}
			if len(seen) == len(clients) {
				for s := range clients {
					lag := max(arrivals[s][rv].Sub(acked), 0) // a watch may deliver before the writer reads its answer
					if c.Procs[s].Name == leaderName {
						leaderLags = append(leaderLags, lag)
					} else {
						followerLags = append(followerLags, lag)
					}
				}
				mu.Unlock()
				break
			}
			mu.Unlock()
			if time.Now().After(deadline) {
				b.Fatalf("change %d (resourceVersion %s) reached %d of %d servers' watches in 10 s", i, rv, len(seen), len(clients))
			}
			time.Sleep(time.Millisecond)
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.StopTimer()
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	lp50, lp99 := quantiles(leaderLags)
	fp50, fp99 := quantiles(followerLags)
	b.Logf("%d label changes through a follower: the leader's watch cache has each p50 %.1f ms p99 %.1f ms after the acknowledgement, the followers' p50 %.1f ms p99 %.1f ms; idle, the three servers used %.1f%% of a CPU",
		b.N, ms(lp50), ms(lp99), ms(fp50), ms(fp99), idlePercent)
	b.ReportMetric(idlePercent, "idle-servers-cpu-%")
	b.ReportMetric(ms(lp50), "leader-p50-ms")
	b.ReportMetric(ms(lp99), "leader-p99-ms")
	b.ReportMetric(ms(fp50), "follower-p50-ms")
	b.ReportMetric(ms(fp99), "follower-p99-ms")
	b.ReportMetric(ms(fp99-lp99), "follower-minus-leader-p99-ms")
	b.ReportMetric(0, "ns/op")
}
