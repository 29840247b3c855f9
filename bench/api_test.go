package bench

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/skiff-dev/skiff/fsm"
	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/raftnode"
)

var (
	listPods     = flag.Int("api.list-pods", 10000, "pods in the list benchmark")
	watcherCount = flag.Int("api.watchers", 1000, "watchers in the fan-out benchmark")
)

// apiCluster starts three server processes and returns a client per peer, without client-side rate limits.
func apiCluster(b *testing.B) (*proctest.Cluster, []kubernetes.Interface) {
	c := proctest.NewCluster(b, 3, "")
	for _, p := range c.Procs {
		c.Start(p)
	}
	var clients []kubernetes.Interface
	for _, p := range c.Procs {
		proctest.WaitFor(b, p.Name+" kubeconfig", 60*time.Second, func() error {
			_, err := os.Stat(p.Kubeconfig())
			return err
		})
		cfg, err := clientcmd.BuildConfigFromFlags("", p.Kubeconfig())
		if err != nil {
			b.Fatal(err)
		}
		client := kubeClient(b, cfg)
		proctest.WaitFor(b, p.Name+" API", 60*time.Second, func() error {
			_, err := client.CoreV1().Namespaces().Get(context.Background(), "default", metav1.GetOptions{})
			return err
		})
		clients = append(clients, client)
	}
	return c, clients
}

// kubeClient is a clientset for cfg that speaks protobuf, as Kubernetes' own components do, with no
// client-side rate limit.
func kubeClient(b *testing.B, cfg *rest.Config) kubernetes.Interface {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = -1, 0
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	return kubernetes.NewForConfigOrDie(cfg)
}

// benchPod is the pod the API benchmark creates. It names a scheduler that does not exist, so that the
// leader's scheduler leaves it alone: with no nodes, it would otherwise write an Unschedulable condition and a
// FailedScheduling event for every pod, and this benchmark would measure three writes per create. The
// scheduler's own writes are measured by BenchmarkScheduler.
func benchPod(name string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "bench"}},
		Spec: corev1.PodSpec{SchedulerName: "bench-no-scheduler", Containers: []corev1.Container{{
			Name: "main", Image: "registry.local/bench:1.0", Command: []string{"sleep", "3600"},
			Env: []corev1.EnvVar{{Name: "MODE", Value: "benchmark"}},
		}}},
	}
}

// run spreads n operations over conc workers and returns throughput and latency percentiles.
func run(b *testing.B, conc, n int, op func(worker, i int) error) (float64, time.Duration, time.Duration) {
	var next atomic.Int64
	lat := make([][]time.Duration, conc)
	var wg sync.WaitGroup
	var failed atomic.Value
	start := time.Now()
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				t0 := time.Now()
				if err := op(w, i); err != nil {
					failed.Store(err)
					return
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	var all []time.Duration
	for _, l := range lat {
		all = append(all, l...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	return float64(n) / elapsed.Seconds(), all[(len(all)-1)/2], all[(len(all)-1)*99/100]
}

// BenchmarkAPI measures, on three `skiff server` processes:
//   - pod creates per second through the API (client-go, protobuf) at concurrency 64, spread over the peers,
//     beside raw store writes of the same size through the same peers' internal RPC, in the same run;
//   - listing 10,000 pods with resourceVersion "" (linearizable) and "0" (from the watch cache);
//   - watch fan-out: 1,000 watchers, p99 delay from a create's acknowledgement to its delivery.
//
// b.N is the number of pod creates; run with -benchtime=10000x.
func BenchmarkAPI(b *testing.B) {
	if firstCallOfTwo(b) {
		return
	}
	c, clients := apiCluster(b)
	ctx := context.Background()
	for _, ns := range []string{"bench", "watch"} {
		createNamespace(b, ctx, clients[0], ns)
	}
	const conc = 64
	n := b.N
	b.ResetTimer()
	profiled := profileServers(b, clients, "api-creates", 5*time.Second)
	apiCPU := startCPU(b, c)
	apiRate, apiP50, apiP99 := run(b, conc, n, func(w, i int) error {
		_, err := clients[w%3].CoreV1().Pods("bench").Create(ctx, benchPod(fmt.Sprintf("p-%06d", i)), metav1.CreateOptions{})
		return err
	})
	b.StopTimer()
	apiClientMs, apiServersMs := apiCPU.perOp(n)
	profiled()
	// The same number of raw store writes of the pods' stored size, through the same peers.
	stored, _ := clients[0].CoreV1().Pods("bench").Get(ctx, "p-000000", metav1.GetOptions{})
	value := make([]byte, stored.Size())
	raw := make([]*raftnode.Client, 3)
	for i, p := range c.Procs {
		raw[i] = p.RaftClient(b)
		defer raw[i].Close()
	}
	rawCPU := startCPU(b, c)
	rawRate, rawP50, rawP99 := run(b, conc, n, func(w, i int) error {
		res, err := raw[w%3].Apply(ctx, &fsm.Command{Type: fsm.CmdCreate, Key: fmt.Sprintf("/bench/raw/%06d", i), Value: value})
		if err == nil {
			err = res.Err()
		}
		return err
	})
	rawClientMs, rawServersMs := rawCPU.perOp(n)
	b.ReportMetric(apiRate, "pod-creates/s")
	b.ReportMetric(ms(apiP50), "create-p50-ms")
	b.ReportMetric(ms(apiP99), "create-p99-ms")
	b.ReportMetric(rawRate, "raw-writes/s")
	b.ReportMetric(apiRate/rawRate, "api/raw")
	b.Logf("raw store writes of %d bytes: %.0f/s, p50 %.2f ms, p99 %.2f ms", len(value), rawRate, ms(rawP50), ms(rawP99))
	// CPU per operation: on a machine where the clients and the servers share the cores, the rates follow it.
	b.ReportMetric(apiServersMs, "create-server-cpu-ms")
	b.ReportMetric(apiClientMs, "create-client-cpu-ms")
	b.ReportMetric(rawServersMs, "raw-server-cpu-ms")
	b.ReportMetric(rawClientMs, "raw-client-cpu-ms")

	// The same creates by a service account that RBAC lets edit its namespace: the request path of a user
	// who is not in system:masters (token authentication, the Node and RBAC authorizers).
	rbacRate, rbacServersMs := rbacCreates(b, c, n, conc)
	b.ReportMetric(rbacRate, "rbac-pod-creates/s")
	b.ReportMetric(rbacServersMs, "rbac-create-server-cpu-ms")

	// Grow to the list size for the list measurement.
	if n < *listPods {
		run(b, conc, *listPods-n, func(w, i int) error {
			_, err := clients[w%3].CoreV1().Pods("bench").Create(ctx, benchPod(fmt.Sprintf("p-%06d", n+i)), metav1.CreateOptions{})
			return err
		})
	}
	for _, rv := range []string{"", "0"} {
		var lats []time.Duration
		for i := 0; i < 10; i++ {
			t0 := time.Now()
			list, err := clients[i%3].CoreV1().Pods("bench").List(ctx, metav1.ListOptions{ResourceVersion: rv})
			if err != nil {
				b.Fatal(err)
			}
			lats = append(lats, time.Since(t0))
			if len(list.Items) < *listPods {
				b.Fatalf("listed %d pods", len(list.Items))
			}
		}
		sort.Slice(lats, func(i, j int) bool { return lats[i] < lats[j] })
		name := "list-rv-empty-p50-ms"
		if rv == "0" {
			name = "list-rv0-p50-ms"
		}
		b.ReportMetric(ms(lats[len(lats)/2]), name)
	}

	b.ReportMetric(ms(watchFanout(b, clients, *watcherCount, 20)), "watch-p99-ms")
	b.ReportMetric(0, "ns/op")
}

// rbacCreates creates n pods as a service account bound to edit in its namespace, through the three peers,
// and returns the rate and the servers' CPU per create.
func rbacCreates(b *testing.B, c *proctest.Cluster, n, conc int) (float64, float64) {
	ctx := context.Background()
	const ns = "bench-rbac"
	clients := writerClients(b, ctx, peerConfigs(b, c), ns, editRole)
	cpu := startCPU(b, c)
	rate, _, _ := run(b, conc, n, func(w, i int) error {
		_, err := clients[w%3].CoreV1().Pods(ns).Create(ctx, benchPod(fmt.Sprintf("p-%06d", i)), metav1.CreateOptions{})
		return err
	})
	_, serversMs := cpu.perOp(n)
	b.Logf("pod creates as a service account with edit: %.0f/s, %.2f ms of server CPU per create", rate, serversMs)
	return rate, serversMs
}

// peerConfigs are the admin's rest configs of a cluster's servers, one each.
func peerConfigs(b *testing.B, c *proctest.Cluster) []*rest.Config {
	var configs []*rest.Config
	for _, p := range c.Procs {
		cfg, err := clientcmd.BuildConfigFromFlags("", p.Kubeconfig())
		if err != nil {
			b.Fatal(err)
		}
		configs = append(configs, cfg)
	}
	return configs
}

// editRole is the edit ClusterRole, which Kubernetes' clusterrole-aggregation controller fills with rules (a
// kube-apiserver without kube-controller-manager has it empty); podWriterRole is a Role of the namespace's
// own, created with the rules below: pods created, read and listed.
var (
	editRole      = rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"}
	podWriterRole = rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "pod-writer"}
)

// writerClients creates ns with its default service account and a service account "writer" bound to role
// there (podWriterRole is created first), through the admin's configs[0], and returns one client per server
// that authenticates with writer's token: the request path of a user who is not in system:masters (token
// authentication, the Node and RBAC authorizers).
func writerClients(b *testing.B, ctx context.Context, configs []*rest.Config, ns string, role rbacv1.RoleRef) []kubernetes.Interface {
	createNamespaceWithServiceAccount(b, ctx, configs[0], ns)
	admin := kubeClient(b, configs[0])
	if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "writer"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		b.Fatal(err)
	}
	if role == podWriterRole {
		if _, err := admin.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: role.Name},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"create", "get", "list"}}}},
			metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			b.Fatal(err)
		}
	}
	if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "writer"},
		RoleRef: role, Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: ns, Name: "writer"}}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		b.Fatal(err)
	}
	tr, err := admin.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "writer", &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	var clients []kubernetes.Interface
	for i, cfg := range configs {
		cfg = rest.AnonymousClientConfig(cfg)
		cfg.BearerToken = tr.Status.Token
		client := kubeClient(b, cfg)
		proctest.WaitFor(b, fmt.Sprintf("server %d: the RBAC binding", i+1), 30*time.Second, func() error {
			_, err := client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{Limit: 1})
			return err
		})
		clients = append(clients, client)
	}
	return clients
}

// watchFanout opens watchers spread over the peers, creates pods, and returns the p99 of the delay from each
// create's acknowledgement to its delivery to each watcher.
func watchFanout(b *testing.B, clients []kubernetes.Interface, watchers, events int) time.Duration {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	acked := map[string]time.Time{}
	var delays []time.Duration
	var ready, done sync.WaitGroup
	for w := 0; w < watchers; w++ {
		wi, err := clients[w%3].CoreV1().Pods("watch").Watch(ctx, metav1.ListOptions{})
		if err != nil {
			b.Fatal(err)
		}
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			defer wi.Stop()
			ready.Done()
			seen := 0
			for ev := range wi.ResultChan() {
				if ev.Type != watch.Added {
					continue
				}
				name := ev.Object.(*corev1.Pod).Name
				now := time.Now()
				mu.Lock()
				for acked[name].IsZero() { // the ack and the event race; wait for the ack time
					mu.Unlock()
					time.Sleep(time.Millisecond)
					mu.Lock()
				}
				delays = append(delays, now.Sub(acked[name]))
				mu.Unlock()
				if seen++; seen == events {
					return
				}
			}
		}()
	}
	ready.Wait()
	time.Sleep(time.Second) // let every watch reach its server
	for i := 0; i < events; i++ {
		name := fmt.Sprintf("w-%03d", i)
		if _, err := clients[i%3].CoreV1().Pods("watch").Create(ctx, benchPod(name), metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		mu.Lock()
		acked[name] = time.Now()
		mu.Unlock()
		time.Sleep(50 * time.Millisecond)
	}
	waitDone := make(chan struct{})
	go func() { done.Wait(); close(waitDone) }()
	select {
	case <-waitDone:
	case <-time.After(2 * time.Minute):
		b.Fatalf("watchers did not receive all %d events", events)
	}
	sort.Slice(delays, func(i, j int) bool { return delays[i] < delays[j] })
	if len(delays) != watchers*events {
		b.Fatalf("%d deliveries, want %d", len(delays), watchers*events)
	}
	return delays[(len(delays)-1)*99/100]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
