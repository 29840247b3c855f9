package proxy

import (
	"context"
	"flag"
	"fmt"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/client-go/tools/cache"
)

var benchServices = flag.Int("proxy.services", 1000, "Services in the proxy benchmarks, with 10 endpoints each")

// benchObjects is -proxy.services ClusterIP Services (1,000 by default; every tenth also a NodePort) with 10
// endpoints each, spread over 10 nodes.
func benchObjects() ([]*corev1.Service, []*discoveryv1.EndpointSlice) {
	var services []*corev1.Service
	var slices []*discoveryv1.EndpointSlice
	for i := range *benchServices {
		name := fmt.Sprintf("svc-%04d", i)
		opts := []func(*corev1.Service){}
		if i%10 == 0 {
			opts = append(opts, nodePort(int32(30000+i)))
		}
		services = append(services, service(name, fmt.Sprintf("10.96.%d.%d", i/250, i%250+1), opts...))
		var eps []ep
		for j := range 10 {
			eps = append(eps, ep{ip: fmt.Sprintf("10.%d.%d.%d", 100+j, i/250, i%250+1), node: fmt.Sprintf("node-%d", j)})
		}
		slices = append(slices, slice(name, eps...))
	}
	return services, slices
}

// BenchmarkBuildRules is the rule generation alone, for the whole set.
func BenchmarkBuildRules(b *testing.B) {
	services, slices := benchObjects()
	facts := testFacts()
	b.ReportAllocs()
	var size int
	for b.Loop() {
		size = len(BuildRules(services, slices, facts).Restore)
	}
	b.ReportMetric(float64(size), "bytes/ruleset")
}

// BenchmarkSync times Proxy.Sync on the real iptables in a throwaway namespace: a full sync (read the
// agent's chains, generate, restore, check the jumps), and a sync after one endpoint changed (generate
// and restore, since the text differs). BenchmarkRestoreOnly loads the same text with iptables-restore
// directly, the floor for any proxy that writes the whole set.
func BenchmarkSync(b *testing.B) {
	for _, mode := range []string{"full", "one-endpoint-change"} {
		b.Run(mode, func(b *testing.B) {
			ns := newTestNetns(b)
			p, err := New(Config{NodeName: "node-0", ID: testID, DataDir: b.TempDir(), PodCIDR: "10.244.0.0/24", Commands: ns.cmds})
			if err != nil {
				b.Fatal(err)
			}
			services, slices := benchObjects()
			p.services = cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
			p.slices = cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
			for _, s := range services {
				_ = p.services.Add(s)
			}
			for _, s := range slices {
				_ = p.slices.Add(s)
			}
			ctx := context.Background()
			if err := p.Sync(ctx, true); err != nil {
				b.Fatal(err)
			}
			defer reportCPU(b)()
			for i := 0; b.Loop(); i++ {
				if mode == "full" {
					if err := p.Sync(ctx, true); err != nil {
						b.Fatal(err)
					}
					continue
				}
				changed := slices[0].DeepCopy()
				changed.Endpoints[0].Addresses = []string{fmt.Sprintf("10.99.%d.%d", i/250%250, i%250+1)}
				_ = p.slices.Update(changed)
				if err := p.Sync(ctx, false); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkRestoreOnly(b *testing.B) {
	ns := newTestNetns(b)
	services, slices := benchObjects()
	rules := BuildRules(services, slices, testFacts()).Restore
	ctx := context.Background()
	b.ReportMetric(float64(len(rules)), "bytes/ruleset")
	defer reportCPU(b)()
	for b.Loop() {
		if err := ns.cmds.restore(ctx, rules); err != nil {
			b.Fatal(err)
		}
	}
}

// reportCPU starts counting the CPU time of this process and of the commands it ran and waited for
// (iptables-restore, iptables-save); the function it returns reports it per operation.
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
