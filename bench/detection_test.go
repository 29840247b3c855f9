package bench

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/skiff-dev/skiff/internal/proctest"

	"github.com/skiff-dev/skiff/internal/freeport"
)

var (
	detectTrials = flag.Int("detect.trials", 20, "kill -9 trials in the node failure detection benchmark")
	trackNodes   = flag.Int("detect.nodes", 5000, "simulated nodes one gossip member hosts, in the tracking-cost row")
	cpuSample    = flag.Duration("detect.cpu-sample", 20*time.Second, "how long the leader's CPU is sampled at steady state, each time")
)

// BenchmarkNodeDetection measures, on three `skiff server` processes and gossiping simulated agents:
//   - detection time: from kill -9 of an agent to its Node's Ready=Unknown, as an informer sees it, p50 and p99
//     over -detect.trials trials (the agent is restarted and Ready again between trials);
//   - the leader's cost of tracking one member that hosts -detect.nodes simulated nodes: its CPU over 20 s of
//     steady state (-detect.cpu-sample), beside the same with no such member.
//
// Run it with -benchtime=1x.
func BenchmarkNodeDetection(b *testing.B) {
	c := proctest.NewCluster(b, 3, fmt.Sprintf("token = %q", benchJoinToken))
	for _, p := range c.Procs {
		c.Start(p)
	}
	client := clientFor(b, c.Procs[0].Kubeconfig())
	leader := c.ByName(c.HealthyPeers(c.Procs[0], 3))
	ports := freeport.Take(b, []string{"127.0.0.1"}, 2)
	ctx := context.Background()

	var mu sync.Mutex
	unknownAt := map[string]time.Time{}
	readyNow := map[string]bool{}
	factory := informers.NewSharedInformerFactory(client, 0)
	observe := func(obj any) {
		node := obj.(*corev1.Node)
		for _, cond := range node.Status.Conditions {
			if cond.Type != corev1.NodeReady {
				continue
			}
			mu.Lock()
			if cond.Status == corev1.ConditionUnknown {
				if _, seen := unknownAt[node.Name]; !seen {
					unknownAt[node.Name] = time.Now()
				}
			}
			readyNow[node.Name] = cond.Status == corev1.ConditionTrue
			mu.Unlock()
		}
	}
	factory.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: observe, UpdateFunc: func(_, o any) { observe(o) }})
	stop := make(chan struct{})
	defer close(stop)
	factory.Start(stop)
	factory.WaitForCacheSync(stop)

	agent := startGossipSimAgent(b, "detect", c.Procs[0].GossipAddr, c.Procs[0].Kubeconfig(), ports[0], 1)
	waitReady := func() {
		proctest.WaitFor(b, "the agent's node Ready", 60*time.Second, func() error {
			mu.Lock()
			defer mu.Unlock()
			if !readyNow["detect"] {
				return fmt.Errorf("not yet")
			}
			return nil
		})
	}
	waitReady()
	b.ResetTimer()
	var times []time.Duration
	for i := 0; i < *detectTrials; i++ {
		mu.Lock()
		delete(unknownAt, "detect")
		mu.Unlock()
		killed := time.Now()
		agent.Process.Kill()
		agent.Wait()
		proctest.WaitFor(b, "Ready=Unknown", 60*time.Second, func() error {
			mu.Lock()
			defer mu.Unlock()
			if _, ok := unknownAt["detect"]; !ok {
				return fmt.Errorf("not yet")
			}
			return nil
		})
		mu.Lock()
		times = append(times, unknownAt["detect"].Sub(killed))
		mu.Unlock()
		agent = startGossipSimAgent(b, "detect", c.Procs[0].GossipAddr, c.Procs[0].Kubeconfig(), ports[0], 1)
		waitReady()
	}
	b.StopTimer()
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
	p50, p99 := times[(len(times)-1)/2], times[(len(times)-1)*99/100]
	b.ReportMetric(ms(p50), "detect-p50-ms")
	b.ReportMetric(ms(p99), "detect-p99-ms")
	b.Logf("kill -9 to Ready=Unknown over %d trials: p50 %.0f ms, p99 %.0f ms (min %.0f ms)", len(times), ms(p50), ms(p99), ms(times[0]))

	// The leader's cost of one member hosting many nodes.
	idleCPU, _ := processUsage(b, leader.PID(), *cpuSample)
	many := startGossipSimAgent(b, "many", c.Procs[0].GossipAddr, c.Procs[0].Kubeconfig(), ports[1], *trackNodes)
	proctest.WaitFor(b, fmt.Sprintf("%d nodes registered", *trackNodes), 5*time.Minute, func() error {
		list, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{ResourceVersion: "0"})
		if err != nil || len(list.Items) < *trackNodes+1 {
			return fmt.Errorf("not yet: %v", err)
		}
		return nil
	})
	time.Sleep(*cpuSample / 2) // past registration, into steady state
	trackCPU, trackRSS := processUsage(b, leader.PID(), *cpuSample)
	b.ReportMetric(trackCPU*100, "leader-cpu-%-tracking")
	b.Logf("leader CPU at steady state over %s: %.1f%% of a CPU with one agent; %.1f%% with one member hosting %d nodes (RSS %.0f MiB)",
		*cpuSample, idleCPU*100, trackCPU*100, *trackNodes, float64(trackRSS)/(1<<20))
	_ = many
}

// startGossipSimAgent runs a simulated agent hosting n nodes that joins by retry_join only, acting as the
// kubeconfig's user; killed at cleanup.
func startGossipSimAgent(b *testing.B, name, join, kubeconfig string, port, n int) *exec.Cmd {
	dir := b.TempDir()
	hcl := fmt.Sprintf(`name = %q
data_dir = %q
bind_addr = "127.0.0.1"
ports { gossip = %d }
agent {
  retry_join = [%q]
  retry_interval = "500ms"
  token = %q
  runtime = "simulated"
  simulated {
    nodes      = %d
    kubeconfig = %q
  }
}
`, name, filepath.Join(dir, "data"), port, join, benchJoinToken, n, kubeconfig)
	path := filepath.Join(dir, "agent.hcl")
	if err := os.WriteFile(path, []byte(hcl), 0o600); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(proctest.Binary(b), "agent", "-config", path)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	return cmd
}
