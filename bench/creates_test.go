package bench

import (
	"context"
	"flag"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var (
	createRounds = flag.Int("creates.rounds", 2, "turns each system takes in BenchmarkCreates")
	createKube   = flag.Bool("creates.kube-apiserver", true, "BenchmarkCreates: measure kube-apiserver with etcd too (false: Skiff alone, as the smoke runs it)")
)

// BenchmarkCreates compares the create path of the two systems under RBAC, side by side in one run: pod
// creates by a service account bound to a Role that lets it create pods (token authentication, the Node and
// RBAC authorizers, admission, protobuf, the store; a Role of the benchmark's own, since edit gets its rules
// from kube-controller-manager, which the Kubernetes side does not run), b.N per turn at concurrency 64 spread over three servers,
// through three `skiff server` processes and through three kube-apiserver 1.37.2 processes over a
// three-member etcd 3.7.2, all built here. Both clusters are up throughout and take turns (-creates.rounds
// each), so that the machine's drift falls on both; the pods name a scheduler that does not run, so neither
// system schedules. Per system it reports the mean rate, the servers' CPU per create (Skiff's servers;
// kube-apiserver and etcd), and their resident memory after the last turn. With -bench.profile-dir it writes
// Skiff's servers' CPU profiles of the first turn (creates-server-<i>.pprof).
//
// Run it with -benchtime=5000x or so.
func BenchmarkCreates(b *testing.B) {
	if firstCallOfTwo(b) {
		return
	}
	ctx := context.Background()
	c, admins := apiCluster(b)
	type system struct {
		name   string
		target apiTarget
	}
	systems := []system{{"skiff", apiTarget{configs: peerConfigs(b, c), pids: clusterPIDs(c)}}}
	if *createKube {
		kas := startKubeAPIServers(b)
		systems = append(systems, system{"kube", apiTarget{configs: kas.configs, pids: kas.pids()}})
	}
	const conc = 64
	rates := map[string][]float64{}
	cpus := map[string][]float64{}
	b.ResetTimer()
	for round := range *createRounds {
		for _, sys := range systems {
			ns := fmt.Sprintf("creates-%d", round)
			clients := writerClients(b, ctx, sys.target.configs, ns, podWriterRole)
			cpu := startCPUOf(b, sys.target.pids)
			profiled := func() {}
			if sys.name == "skiff" && round == 0 {
				// The servers' CPU profiles of the first turn's first 10 s (with -bench.profile-dir).
				profiled = profileServers(b, admins, "creates", 10*time.Second)
			}
			rate, p50, p99 := run(b, conc, b.N, func(w, i int) error {
				_, err := clients[w%len(clients)].CoreV1().Pods(ns).Create(ctx, benchPod(fmt.Sprintf("p-%06d", i)), metav1.CreateOptions{})
				return err
			})
			_, serversMs := cpu.perOp(b.N)
			profiled()
			rates[sys.name] = append(rates[sys.name], rate)
			cpus[sys.name] = append(cpus[sys.name], serversMs)
			b.Logf("turn %d, %s: %d creates as a service account, %.0f/s, p50 %.1f ms, p99 %.1f ms, %.2f ms of server CPU per create",
				round+1, sys.name, b.N, rate, ms(p50), ms(p99), serversMs)
			time.Sleep(5 * time.Second) // the servers' work after the last acknowledgement (watch caches, GC)
		}
	}
	b.StopTimer()
	mean := func(v []float64) float64 {
		sum := 0.0
		for _, x := range v {
			sum += x
		}
		return sum / float64(len(v))
	}
	for _, sys := range systems {
		prefix := ""
		if sys.name == "kube" {
			prefix = "kas-"
		}
		mib := float64(rss(b, sys.target.pids)) / (1 << 20)
		b.ReportMetric(mean(rates[sys.name]), prefix+"rbac-pod-creates/s")
		b.ReportMetric(mean(cpus[sys.name]), prefix+"rbac-create-server-cpu-ms")
		b.ReportMetric(mib, prefix+"servers-rss-MiB")
		b.Logf("%s: rates %.0f/s, server CPU per create %.2f ms; the servers' RSS %.0f MiB after %d pods",
			sys.name, rates[sys.name], cpus[sys.name], mib, *createRounds*b.N)
	}
	if *createKube {
		b.ReportMetric(mean(rates["skiff"])/mean(rates["kube"]), "skiff/kube-rate")
	}
	b.ReportMetric(0, "ns/op")
}
