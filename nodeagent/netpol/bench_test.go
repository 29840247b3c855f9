package netpol

import (
	"context"
	"flag"
	"sort"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/cache"

	"github.com/skiff-dev/skiff/internal/netnstest"
	"github.com/skiff-dev/skiff/internal/netpolbench"
)

var (
	benchPolicies = flag.Int("netpol.policies", 1000, "NetworkPolicies in the benchmarks")
	benchPods     = flag.Int("netpol.pods", 5000, "pods in the benchmarks, over 50 nodes and 50 namespaces (internal/netpolbench)")
)

// benchObjects is internal/netpolbench's cluster at -netpol.policies and -netpol.pods.
func benchObjects() ([]*networkingv1.NetworkPolicy, []*corev1.Pod, []*corev1.Namespace) {
	return netpolbench.Objects(*benchPolicies, *benchPods)
}

func ptr[T any](v T) *T { return &v }

func benchInput() Input {
	policies, pods, nss := benchObjects()
	return Input{ID: "0000abcd", Owner: "skiff:0000abcd:", Policies: policies, Pods: pods, Namespaces: nss,
		Local: func(p *corev1.Pod) bool { return p.Spec.NodeName == "node-0" }}
}

// BenchmarkBuild is the rule generation alone, for node-0's pods.
func BenchmarkBuild(b *testing.B) {
	in := benchInput()
	b.ReportAllocs()
	var rs *Ruleset
	for b.Loop() {
		rs = Build(in)
	}
	entries := 0
	for _, s := range rs.Sets {
		entries += len(s.Entries)
	}
	b.ReportMetric(float64(len(rs.Restore)), "bytes/ruleset")
	b.ReportMetric(float64(rs.Isolated), "isolated-pods")
	b.ReportMetric(float64(len(rs.Sets)), "sets")
	b.ReportMetric(float64(entries), "set-entries")
}

// BenchmarkPolicySync times Engine.Sync on the real iptables and ipset in a throwaway namespace, after one
// policy changed (a new port on an ingress rule, so that the chains of the pods it selects change), which
// is what a policy write costs a node once its informer has it: build, create the new sets, restore the
// chains, destroy the old sets. It reports the p50 and p99 of that programming latency and the CPU it took,
// the iptables and ipset processes included. The first, full sync is reported apart.
func BenchmarkPolicySync(b *testing.B) {
	ns := netnstest.New(b, "skiffnp", "iptables", "iptables-restore", "ipset")
	e, err := New(Config{ID: "0000abcd", Owner: "skiff:0000abcd:", Local: func(n string) bool { return n == "node-0" },
		Commands: Commands{IPTables: ns.Wrap(b, "iptables"), IPTablesSave: ns.Wrap(b, "iptables-save"),
			IPTablesRestore: ns.Wrap(b, "iptables-restore"), IPSet: ns.Wrap(b, "ipset")}})
	if err != nil {
		b.Fatal(err)
	}
	e.policies = cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	e.pods = cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	e.namespaces = cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	policies, pods, nss := benchObjects()
	for _, p := range policies {
		_ = e.policies.Add(p)
	}
	for _, p := range pods {
		_ = e.pods.Add(p)
	}
	for _, n := range nss {
		_ = e.namespaces.Add(n)
	}
	ctx := context.Background()
	start := time.Now()
	if err := e.Sync(ctx); err != nil {
		b.Fatal(err)
	}
	first := time.Since(start)
	var took []time.Duration
	defer reportCPU(b)()
	for i := 0; b.Loop(); i++ {
		changed := policies[(i*4)%len(policies)].DeepCopy() // an ingress policy of shape 0
		changed.Spec.Ingress[0].Ports = append(changed.Spec.Ingress[0].Ports, tcp(intstr.FromInt32(int32(10000+i%50000))))
		_ = e.policies.Update(changed)
		start := time.Now()
		if err := e.Sync(ctx); err != nil {
			b.Fatal(err)
		}
		took = append(took, time.Since(start))
	}
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	at := func(q float64) float64 { return float64(took[int(q*float64(len(took)-1))].Microseconds()) / 1000 }
	b.ReportMetric(at(0.5), "p50-ms")
	b.ReportMetric(at(0.99), "p99-ms")
	b.ReportMetric(float64(first.Milliseconds()), "first-sync-ms")
}

// reportCPU counts the CPU time of this process and of the commands it ran and waited for; the function it
// returns reports it per operation.
func reportCPU(b *testing.B) func() {
	cpu := func() time.Duration {
		var self, children syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &self)
		_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &children)
		var total time.Duration
		for _, tv := range []syscall.Timeval{self.Utime, self.Stime, children.Utime, children.Stime} {
			total += time.Duration(tv.Nano())
		}
		return total
	}
	start := cpu()
	return func() { b.ReportMetric((cpu()-start).Seconds()/float64(b.N), "cpu-s/op") }
}
