package bench

import (
	"context"
	"flag"
	"fmt"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/skiff-dev/skiff/internal/netnstest"
	"github.com/skiff-dev/skiff/internal/netpolbench"
	"github.com/skiff-dev/skiff/nodeagent/netpol"
)

var (
	netpolPolicies = flag.Int("netpol.policies", 1000, "NetworkPolicies in the policy programming benchmark")
	netpolPods     = flag.Int("netpol.pods", 5000, "pods in the policy programming benchmark (internal/netpolbench)")
)

// BenchmarkPolicyProgramming measures how long a NetworkPolicy change takes to be in force on a node, from
// the API's acknowledgement to the node's iptables: three `skiff server` processes hold -netpol.pods pods
// (5,000 on 50 simulated nodes, with their addresses in their status) and -netpol.policies policies (1,000);
// node-0's policy engine (nodeagent/netpol, as an agent runs it, with real iptables and ipset in a network
// namespace of its own) watches them through a follower. Each operation adds a port to an ingress policy that
// isolates node-0's pods, through another server, and polls the node's rules (iptables-save, every 5 ms) until
// the port is there. p50 and p99 of that latency, and the engine's first sync at this size.
func BenchmarkPolicyProgramming(b *testing.B) {
	if firstCallOfTwo(b) {
		return
	}
	ns := netnstest.New(b, "skiffnpb", "iptables-save", "iptables-restore", "ipset")
	c, clients := apiCluster(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	leader := c.HealthyPeers(c.Procs[0], 3)
	var writer, watcher kubernetes.Interface
	for i, p := range c.Procs {
		if p.Name == leader {
			writer = clients[i]
		} else if watcher == nil {
			watcher = clients[i]
		}
	}
	policies, pods, namespaces := netpolbench.Objects(*netpolPolicies, *netpolPods)
	loadPolicyCluster(b, ctx, writer, policies, pods, namespaces)

	wrap := func(tool string) string { return ns.Wrap(b, tool) }
	save := wrap("iptables-save")
	engine, err := netpol.New(netpol.Config{ID: "0000beef", Owner: "skiff:0000beef:", Client: watcher,
		Local: func(n string) bool { return n == netpolbench.Node(0) }, Logger: hclog.NewNullLogger(),
		Commands: netpol.Commands{IPTables: wrap("iptables"), IPTablesSave: save, IPTablesRestore: wrap("iptables-restore"), IPSet: wrap("ipset")}})
	if err != nil {
		b.Fatal(err)
	}
	started := time.Now()
	go engine.Run(ctx)
	rules := func() string {
		out, _ := exec.Command(save, "-t", "filter").Output()
		return string(out)
	}
	// The first sync: the chains of node-0's isolated pods.
	var first time.Duration
	for deadline := time.Now().Add(2 * time.Minute); ; {
		if strings.Count(rules(), "-j REJECT") > 0 {
			first = time.Since(started)
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("no rules for node-0's pods after 2 minutes")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// An ingress policy (shape 0) of a namespace with pods on node-0: every namespace has some.
	target := policies[0]
	var took []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		port := 10000 + i
		patch := fmt.Sprintf(`{"spec":{"ingress":[{"from":[{"podSelector":{"matchLabels":{"tier":"tier-0"}}}],"ports":[{"protocol":"TCP","port":"http"},{"protocol":"TCP","port":%d}]}]}}`, port)
		if _, err := writer.NetworkingV1().NetworkPolicies(target.Namespace).Patch(ctx, target.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			b.Fatal(err)
		}
		acked := time.Now()
		want := fmt.Sprintf("--dport %d ", port)
		for deadline := acked.Add(30 * time.Second); !strings.Contains(rules(), want); {
			if time.Now().After(deadline) {
				b.Fatalf("port %d not in node-0's rules 30 s after the write", port)
			}
			time.Sleep(5 * time.Millisecond)
		}
		took = append(took, time.Since(acked))
	}
	b.StopTimer()
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	at := func(q float64) float64 { return float64(took[int(q*float64(len(took)-1))].Microseconds()) / 1000 }
	b.ReportMetric(at(0.5), "p50-ms")
	b.ReportMetric(at(0.99), "p99-ms")
	b.ReportMetric(float64(first.Milliseconds()), "first-sync-ms")
	// The namespace's deletion (at cleanup) takes the engine's rules and sets with it.
}

// loadPolicyCluster creates the namespaces, the pods (with their addresses written into their status, as
// their agents would) and the policies, 32 writes at a time.
func loadPolicyCluster(b *testing.B, ctx context.Context, client kubernetes.Interface, policies []*networkingv1.NetworkPolicy,
	pods []*corev1.Pod, namespaces []*corev1.Namespace) {
	for _, ns := range namespaces {
		createNamespace(b, ctx, client, ns.Name)
		if _, err := client.CoreV1().Namespaces().Patch(ctx, ns.Name, types.MergePatchType,
			[]byte(fmt.Sprintf(`{"metadata":{"labels":{"team":%q}}}`, ns.Labels["team"])), metav1.PatchOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	work := make(chan func() error)
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	for range 32 {
		wg.Go(func() {
			for w := range work {
				if err := w(); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		})
	}
	for _, p := range pods {
		work <- func() error {
			created, err := client.CoreV1().Pods(p.Namespace).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Labels: p.Labels},
				Spec: p.Spec}, metav1.CreateOptions{})
			if err != nil {
				return err
			}
			created.Status = p.Status
			_, err = client.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{})
			return err
		}
	}
	for _, pol := range policies {
		work <- func() error {
			_, err := client.NetworkingV1().NetworkPolicies(pol.Namespace).Create(ctx, pol, metav1.CreateOptions{})
			return err
		}
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		b.Fatal(err)
	default:
	}
}
