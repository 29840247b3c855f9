package bench

import (
	"context"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/skiff-dev/skiff/internal/freeport"
	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/nodeagent"
)

var (
	scaleSteps          = flag.String("scale.steps", "500", "node counts, comma-separated: one fresh cluster per step")
	scaleSystems        = flag.String("scale.systems", "skiff,kubernetes", "the systems each step runs on, in turn: skiff, kubernetes (kube-apiserver, etcd, kube-controller-manager, kube-scheduler and kwok, all built here)")
	scalePodsPerNode    = flag.Int("scale.pods-per-node", 30, "running pods per node the workload aims at (clusterloader2's PODS_PER_NODE)")
	scaleNodesPerNS     = flag.Int("scale.nodes-per-namespace", 100, "nodes per test namespace (clusterloader2's NODES_PER_NAMESPACE)")
	scaleNodesPerMember = flag.Int("scale.nodes-per-member", 50, "simulated nodes each gossip member (agent process) hosts")
	scaleCreators       = flag.Int("scale.creators", 32, "concurrent clients creating the workload's objects")
	scaleIdle           = flag.Duration("scale.idle", time.Minute, "how long the idle cluster's store writes are counted")
	scaleReport         = flag.String("scale.report", "", "a file the table is appended to, in Markdown")
	scaleLatencyPods    = flag.Int("scale.latency-pods", 500, "pods of the pod startup SLI, created at 5 a second on the saturated cluster (clusterloader2's latency pods, at least 500)")
	scaleServerHCL      = flag.String("scale.server-hcl", "", "more of Skiff's server block, in HCL (e.g. 'watch_history { age = \"90s\" }'), to measure a setting")
	scaleDeadHosts      = flag.Int("scale.dead-hosts", 4, "Skiff's simulated agents killed one after another to time dead-node detection (Kubernetes: one kwok process)")
)

// The scalability SLOs of sig-scalability this benchmark checks, measured at the client.
var scaleSLOs = []struct {
	sli   string
	limit time.Duration
}{
	{"mutating", time.Second},
	{"get", time.Second},
	{"list-namespace", 5 * time.Second},
	{"list-cluster", 30 * time.Second},
	{"pod-startup", 5 * time.Second},
}

// BenchmarkScale runs a workload shaped like clusterloader2's load config (kubernetes/perf-tests,
// clusterloader2/testing/load) against three `skiff server` processes whose nodes are simulated by agent
// processes, each a gossip member hosting -scale.nodes-per-member nodes, so that gossip runs at the size the
// step sets. For each step of -scale.steps, on a fresh cluster:
//   - saturation: per namespace of -scale.nodes-per-namespace nodes, a quarter of its pods in Deployments of
//     250, a quarter in Deployments of 30, half in Deployments of 5, each with a ConfigMap and a Secret it
//     mounts, every other one behind a ClusterIP Service, small Jobs beside them, and one DaemonSet over
//     every node; created at -scale.creators concurrency until -scale.pods-per-node pods per node run;
//   - latency pods: -scale.latency-pods one-replica Deployments over the namespaces, created at 5 a second on
//     the saturated cluster, then deleted (clusterloader2's pod-startup-latency module: the pods its 5 s pod
//     startup SLO is judged on; it holds the saturation's pods, created as fast as the workload goes, to 1 h);
//   - churn: every Deployment scaled to between 50% and 150% of its size, until the pods settle;
//   - the SLIs, measured at the client throughout: mutating calls (the workload's own creates and a probe's
//     updates), single-object reads, namespace and cluster-wide lists (through every server, followers
//     included), and pod startup (first seen by a watch to Running and Ready, a little stricter than
//     clusterloader2's first seen to Running) of the latency pods, with the saturation's pods' beside it;
//   - the idle cluster's store writes per node per minute, the control plane's CPU seconds and peak RSS;
//   - dead nodes: the process that runs a group of nodes (a Skiff simulated agent, one gossip member; a kwok
//     process) killed with SIGKILL, and the time until each of its nodes is Ready=Unknown, as a watch sees it;
//   - a leader killed with SIGKILL: the time until a write through a survivor succeeds, and until the
//     restarted server serves a consistent list again;
//   - a new server joining at full size (Skiff; a fourth peer): the time from its start until it serves a
//     consistent list, having caught up with the store (by snapshot, as Raft sends a peer that far behind).
//
// Run with -benchtime=1x; `make bench-scale` runs the steps of the issue, `make bench` a small one.
func BenchmarkScale(b *testing.B) {
	var rows []scaleRow
	for _, f := range strings.Split(*scaleSteps, ",") {
		nodes, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || nodes < 1 {
			b.Fatalf("-scale.steps: %q is not a node count", f)
		}
		for _, system := range strings.Split(*scaleSystems, ",") {
			start, ok := map[string]func(*testing.B, int) *scaleTarget{"skiff": startSkiffScale, "kubernetes": startKubeScale}[system]
			if !ok {
				b.Fatalf("-scale.systems: %q is neither skiff nor kubernetes", system)
			}
			b.Run(fmt.Sprintf("%s-%d", system, nodes), func(b *testing.B) {
				rows = append(rows, scaleStep(b, start(b, nodes), nodes))
			})
		}
	}
	table := scaleTable(rows)
	fmt.Println(table) // the parent benchmark's own log is not printed beside its sub-benchmarks'
	if *scaleReport != "" {
		f, err := os.OpenFile(*scaleReport, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		fmt.Fprintf(f, "\n%s, -scale.pods-per-node=%d -scale.nodes-per-member=%d\n\n%s", time.Now().UTC().Format("2006-01-02 15:04"), *scalePodsPerNode, *scaleNodesPerMember, table)
	}
}

// scaleTarget is a control plane with its nodes up, as the workload sees it.
type scaleTarget struct {
	system  string
	clients []kubernetes.Interface // one per server
	// machines are the control plane's processes, by server: a Skiff server's one process; a Kubernetes
	// control-plane machine's etcd, kube-apiserver, kube-controller-manager and kube-scheduler.
	machines func() [][]int
	// killLeader kills the leader with SIGKILL and returns the index of a survivor and a restart function.
	killLeader func() (survivor, killed int, restart func())
	// killNodeHost kills the i-th process that runs nodes (i < nodeHosts) with SIGKILL and returns the names
	// of its nodes and what starts it again.
	killNodeHost func(i int) (nodes []string, restart func())
	nodeHosts    int
	// joinServer starts one more server, which joins the others, and returns its admin kubeconfig's path;
	// nil where the system has no such step here.
	joinServer func() (kubeconfig string)
}

// startSkiffScale starts three servers and ceil(nodes/-scale.nodes-per-member) simulated agents, and waits
// for every node to be Ready.
func startSkiffScale(b *testing.B, nodes int) *scaleTarget {
	c := proctest.NewCluster(b, 3, fmt.Sprintf("token = %q\n%s", benchJoinToken, *scaleServerHCL))
	for _, p := range c.Procs {
		c.Start(p)
	}
	var clients []kubernetes.Interface
	for _, p := range c.Procs {
		clients = append(clients, clientFor(b, p.Kubeconfig()))
	}
	members := (nodes + *scaleNodesPerMember - 1) / *scaleNodesPerMember
	ports := freeport.Take(b, []string{"127.0.0.1"}, members)
	agents := make([]*exec.Cmd, members)
	hosted := func(m int) int { return min(*scaleNodesPerMember, nodes-m**scaleNodesPerMember) }
	start := func(m int) {
		server := c.Procs[m%3]
		agents[m] = startGossipSimAgent(b, fmt.Sprintf("sim%04d", m), server.GossipAddr, server.Kubeconfig(), ports[m], hosted(m))
	}
	for m := range members {
		start(m)
	}
	waitNodesReady(b, clients[0], nodes)
	return &scaleTarget{
		system:  "skiff",
		clients: clients,
		machines: func() [][]int {
			var m [][]int
			for _, pid := range clusterPIDs(c) {
				m = append(m, []int{pid})
			}
			return m
		},
		killLeader: func() (int, int, func()) {
			name := c.HealthyPeers(c.Procs[0], 3)
			for i, p := range c.Procs {
				if p.Name == name {
					c.Kill(p)
					return (i + 1) % 3, i, func() { c.Start(p) }
				}
			}
			b.Fatalf("leader %q is none of the servers", name)
			return 0, 0, nil
		},
		joinServer: func() string {
			p := c.Add()
			c.Start(p)
			return p.Kubeconfig()
		},
		// The last members first: the first hold the DaemonSet's and Deployments' pods as evenly as the rest.
		nodeHosts: members - 1,
		killNodeHost: func(i int) ([]string, func()) {
			m := members - 1 - i
			agents[m].Process.Kill()
			agents[m].Wait()
			name := fmt.Sprintf("sim%04d", m)
			if hosted(m) == 1 {
				return []string{name}, func() { start(m) } // as the agent names its only node
			}
			var names []string
			for j := range hosted(m) {
				names = append(names, fmt.Sprintf("%s-%d", name, j))
			}
			return names, func() { start(m) }
		},
	}
}

// waitNodesReady waits until n nodes report Ready.
func waitNodesReady(b *testing.B, client kubernetes.Interface, n int) {
	t0 := time.Now()
	waitUntil(b, fmt.Sprintf("%d nodes Ready", n), 20*time.Minute, func() (bool, string) {
		list, err := client.CoreV1().Nodes().List(context.Background(), metav1.ListOptions{ResourceVersion: "0"})
		if err != nil {
			return false, err.Error()
		}
		ready := 0
		for _, node := range list.Items {
			for _, cond := range node.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		return ready >= n, fmt.Sprintf("%d of %d Ready", ready, n)
	})
	b.Logf("%d nodes Ready %v after the servers", n, time.Since(t0).Round(time.Second))
}

// scaleRow is one system at one step.
type scaleRow struct {
	system                string
	nodes, pods           int
	p99                   map[string]time.Duration
	startupP50            time.Duration // of the latency pods, whose p99 is p99["pod-startup"]
	workloadStartupP50    time.Duration // of the saturation's and churn's pods
	workloadStartupP99    time.Duration
	saturation, churn     time.Duration
	cpuSeconds            float64
	peakRSS, peakRSSTotal int64
	idleWritesPerNodeMin  float64
	deadHosts, deadNodes  int
	deadP50, deadP99      time.Duration
	failover, restartRead time.Duration
	joinRead              time.Duration // 0: not measured
}

// scaleStep runs the workload on t and measures it.
func scaleStep(b *testing.B, t *scaleTarget, nodes int) scaleRow {
	ctx := context.Background()
	lat := &sliRecorder{d: map[string][]time.Duration{}}
	nsCount := max(1, nodes / *scaleNodesPerNS)
	namespaces := make([]string, nsCount)
	for i := range namespaces {
		namespaces[i] = fmt.Sprintf("scale-%d", i)
		createNamespace(b, ctx, t.clients[i%3], namespaces[i])
	}
	plan := planScale(namespaces, nodes)
	watcher := watchPods(b, t.clients[0])
	defer watcher.stop()

	cpu := startCPUOf(b, slices.Concat(t.machines()...))
	probeCtx, stopProbes := context.WithCancel(ctx)
	probesDone := probe(probeCtx, t.clients, namespaces, lat)

	// Saturation, with the servers' CPU profiles of its first 90 s (with -bench.profile-dir).
	waitProfiles := profileServers(b, t.clients, fmt.Sprintf("scale-%s-%d-saturation-cpu", t.system, nodes), 90*time.Second)
	t0 := time.Now()
	ops := plan.creates()
	run(b, *scaleCreators, len(ops), func(w, i int) error {
		t1 := time.Now()
		err := ops[i](ctx, t.clients[w%3])
		lat.add("mutating", time.Since(t1))
		return err
	})
	want := plan.runningPods() + nodes // the DaemonSet's pods
	watcher.waitRunning(b, want, 60*time.Minute)
	saturation := time.Since(t0)
	b.Logf("saturation: %d pods running on %d nodes %v after the first create (%d objects created)", want, nodes, saturation.Round(time.Second), len(ops))
	waitProfiles()
	heapProfiles(b, t.clients, fmt.Sprintf("scale-%s-%d", t.system, nodes))
	// The lists at full size, through every server, beside the probe's periodic ones.
	for i, c := range t.clients {
		for _, l := range []struct {
			sli string
			ns  string
		}{{"list-cluster", ""}, {"list-namespace", namespaces[i%len(namespaces)]}} {
			t1 := time.Now()
			if _, err := c.CoreV1().Pods(l.ns).List(ctx, metav1.ListOptions{}); err != nil {
				b.Fatalf("listing pods through server %d: %v", i, err)
			}
			lat.add(l.sli, time.Since(t1))
		}
	}

	latencyPods(b, t, namespaces, lat, watcher, want)

	// Churn: every Deployment to between 50% and 150% of its size.
	t0 = time.Now()
	rng := rand.New(rand.NewSource(int64(nodes)))
	scaled := plan.scale(rng)
	run(b, *scaleCreators, len(scaled), func(w, i int) error {
		t1 := time.Now()
		err := scaled[i](ctx, t.clients[w%3])
		lat.add("mutating", time.Since(t1))
		return err
	})
	want = plan.runningPods() + nodes
	watcher.waitRunning(b, want, 60*time.Minute)
	churn := time.Since(t0)
	b.Logf("churn: %d pods running %v after the first scale", want, churn.Round(time.Second))
	stopProbes()
	<-probesDone
	_, serversTicks := cpu.read()
	serversTicks -= cpu.servers

	row := scaleRow{system: t.system, nodes: nodes, pods: want, p99: map[string]time.Duration{}, saturation: saturation, churn: churn,
		cpuSeconds: float64(serversTicks) / 100}
	// A machine's peak is the sum of its processes' peaks: an upper bound where it has several.
	for _, m := range t.machines() {
		var hwm int64
		for _, pid := range m {
			hwm += peakRSS(b, pid)
		}
		row.peakRSS = max(row.peakRSS, hwm)
		row.peakRSSTotal += hwm
	}
	for sli, d := range lat.d {
		row.p99[sli] = percentile(d, 99)
		b.Logf("%s: %d calls, p50 %.0f ms, p99 %.0f ms", sli, len(d), ms(percentile(d, 50)), ms(percentile(d, 99)))
	}
	for _, latency := range []bool{true, false} {
		startups, toBound, boundToReady := watcher.startups(latency)
		p50, p99 := percentile(startups, 50), percentile(startups, 99)
		which := "latency pods"
		if latency {
			row.startupP50, row.p99["pod-startup"] = p50, p99
		} else {
			which = "saturation and churn pods"
			row.workloadStartupP50, row.workloadStartupP99 = p50, p99
		}
		b.Logf("pod startup, %s: %d pods, p50 %.0f ms, p99 %.0f ms; first seen to bound p50 %.0f ms, p99 %.0f ms; bound to Running and Ready p50 %.0f ms, p99 %.0f ms",
			which, len(startups), ms(p50), ms(p99), ms(percentile(toBound, 50)), ms(percentile(toBound, 99)),
			ms(percentile(boundToReady, 50)), ms(percentile(boundToReady, 99)))
	}

	// The idle cluster's writes: the store's revision before and after the window, which starts once the
	// controllers' last status updates of the churn are in. (Skiff's revision is its Raft index, which also
	// counts the empty entry that tells followers of a commit at once: the watches count object writes.)
	time.Sleep(30 * time.Second)
	rev0 := storeRevision(b, t.clients[0])
	byKind := idleWriters(ctx, t.clients[0], rev0, *scaleIdle)
	rev1 := storeRevision(b, t.clients[0])
	row.idleWritesPerNodeMin = float64(rev1-rev0) / float64(nodes) / scaleIdle.Minutes()
	b.Logf("idle for %v: %d writes (%.2f per node per minute); by kind, as watches saw them: %v", *scaleIdle, rev1-rev0, row.idleWritesPerNodeMin, byKind)

	// Dead nodes, then the cluster whole again.
	hosts := min(*scaleDeadHosts, t.nodeHosts)
	if detections := deadNodeDetection(b, t, hosts); len(detections) > 0 {
		row.deadHosts, row.deadNodes = hosts, len(detections)
		row.deadP50, row.deadP99 = percentile(detections, 50), percentile(detections, 99)
		b.Logf("dead nodes: %d hosts killed, %d nodes Ready=Unknown after p50 %.0f ms, p99 %.0f ms (max %.0f ms)",
			hosts, len(detections), ms(row.deadP50), ms(row.deadP99), ms(percentile(detections, 100)))
		waitNodesReady(b, t.clients[0], nodes)
	}

	// A leader killed at full size.
	survivor, killed, restart := t.killLeader()
	t0 = time.Now()
	waitUntil(b, "a write through a survivor", 5*time.Minute, func() (bool, string) {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := t.clients[survivor].CoreV1().ConfigMaps("default").Create(cctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{GenerateName: "failover-"}}, metav1.CreateOptions{})
		return err == nil, fmt.Sprint(err)
	})
	row.failover = time.Since(t0)
	restart()
	t0 = time.Now()
	waitUntil(b, "the restarted server's consistent list", 10*time.Minute, func() (bool, string) {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := t.clients[killed].CoreV1().Namespaces().List(cctx, metav1.ListOptions{})
		return err == nil, fmt.Sprint(err)
	})
	row.restartRead = time.Since(t0)
	b.Logf("leader killed: writes through a survivor %v later; the restarted server served a consistent list %v after its start",
		row.failover.Round(time.Millisecond), row.restartRead.Round(time.Millisecond))

	if t.joinServer != nil {
		row.joinRead = consistentListAfterJoin(b, t.joinServer())
		b.Logf("a new server served a consistent list of the %d pods %v after its start", row.pods, row.joinRead.Round(time.Millisecond))
	}

	b.ReportMetric(float64(row.pods), "pods")
	b.ReportMetric(ms(row.p99["mutating"]), "mutating-p99-ms")
	b.ReportMetric(ms(row.p99["get"]), "get-p99-ms")
	b.ReportMetric(ms(row.p99["list-cluster"]), "list-cluster-p99-ms")
	b.ReportMetric(ms(row.p99["pod-startup"]), "pod-startup-p99-ms")
	b.ReportMetric(float64(row.peakRSS)/(1<<20), "peak-rss-MiB/server")
	b.ReportMetric(row.idleWritesPerNodeMin, "idle-writes/node/min")
	b.ReportMetric(ms(row.deadP99), "dead-node-p99-ms")
	b.ReportMetric(0, "ns/op")
	return row
}

// deadNodeDetection kills t's first hosts of nodes one after another, each once its predecessor's nodes are
// all Ready=Unknown, and returns, for every node of theirs, the time from its host's kill until a watch saw it
// Unknown. Each host is started again after its measurement.
func deadNodeDetection(b *testing.B, t *scaleTarget, hosts int) []time.Duration {
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var watching map[string]bool // the killed host's nodes
	unknownAt := map[string]time.Time{}
	observe := func(obj any) {
		node, ok := obj.(*corev1.Node)
		if !ok {
			return
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady && c.Status == corev1.ConditionUnknown {
				mu.Lock()
				if _, seen := unknownAt[node.Name]; !seen && watching[node.Name] {
					unknownAt[node.Name] = time.Now()
				}
				mu.Unlock()
			}
		}
	}
	factory := informers.NewSharedInformerFactory(t.clients[0], 0)
	if _, err := factory.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: observe, UpdateFunc: func(_, o any) { observe(o) }}); err != nil {
		b.Fatal(err)
	}
	factory.Start(ctx.Done())
	defer func() {
		cancel() // first: Shutdown waits for the informers, which stop when ctx ends
		factory.Shutdown()
	}()
	factory.WaitForCacheSync(ctx.Done())
	var times []time.Duration
	for i := range hosts {
		mu.Lock()
		names, restart := t.killNodeHost(i)
		killed := time.Now()
		watching = map[string]bool{}
		for _, n := range names {
			watching[n] = true
		}
		mu.Unlock()
		waitUntil(b, fmt.Sprintf("the %d nodes of a killed host Ready=Unknown", len(names)), 5*time.Minute, func() (bool, string) {
			mu.Lock()
			defer mu.Unlock()
			missing := 0
			for _, n := range names {
				if _, ok := unknownAt[n]; !ok {
					missing++
				}
			}
			return missing == 0, fmt.Sprintf("%d of %d not yet", missing, len(names))
		})
		mu.Lock()
		var first, last time.Duration
		for j, n := range names {
			d := unknownAt[n].Sub(killed)
			times = append(times, d)
			if j == 0 || d < first {
				first = d
			}
			last = max(last, d)
		}
		mu.Unlock()
		// The kill's wall-clock time, to find it in the servers' logs (SKIFF_KEEP_LOGS keeps them).
		b.Logf("dead nodes: host %d of %d killed at %s: its %d nodes Unknown %.0f to %.0f ms later", i+1, hosts,
			killed.Format("15:04:05.000"), len(names), ms(first), ms(last))
		restart()
		waitHostSettled(b, t.clients[0], names)
	}
	return times
}

// waitHostSettled waits until a restarted host's nodes are Ready and every pod bound to them that has not
// finished is Ready again: its agent has registered its nodes and reported its pods anew. The next host is
// killed only then, so each kill is timed on a settled cluster (as BenchmarkNodeDetection times it), not
// beside the previous host's recovery (50 nodes and 1,500 pod status writes at 30 pods a node).
func waitHostSettled(b *testing.B, client kubernetes.Interface, nodes []string) {
	t0 := time.Now()
	waitUntil(b, fmt.Sprintf("the %d nodes of a restarted host and their pods Ready", len(nodes)), 10*time.Minute, func() (bool, string) {
		time.Sleep(time.Second)
		for _, name := range nodes {
			node, err := client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{ResourceVersion: "0"})
			if err != nil {
				return false, err.Error()
			}
			if !conditionTrue(node.Status.Conditions, corev1.NodeReady) {
				return false, fmt.Sprintf("node %s not Ready", name)
			}
			pods, err := client.CoreV1().Pods("").List(context.Background(), metav1.ListOptions{ResourceVersion: "0",
				FieldSelector: "spec.nodeName=" + name})
			if err != nil {
				return false, err.Error()
			}
			for _, pod := range pods.Items {
				if pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed && !podReady(&pod) {
					return false, fmt.Sprintf("pod %s/%s on %s not Ready", pod.Namespace, pod.Name, name)
				}
			}
		}
		return true, ""
	})
	b.Logf("a restarted host's %d nodes and their pods Ready again %v after its start", len(nodes), time.Since(t0).Round(time.Second))
}

func conditionTrue(conds []corev1.NodeCondition, typ corev1.NodeConditionType) bool {
	for _, c := range conds {
		if c.Type == typ {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// sliRecorder keeps every latency by SLI.
type sliRecorder struct {
	mu sync.Mutex
	d  map[string][]time.Duration
}

func (r *sliRecorder) add(sli string, d time.Duration) {
	r.mu.Lock()
	r.d[sli] = append(r.d[sli], d)
	r.mu.Unlock()
}

func percentile(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), d...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[(len(s)-1)*p/100]
}

// probe measures, beside the workload and through every server in turn, single-object reads (a node, a
// ConfigMap; 5 a second), mutating calls (a ConfigMap's update; 2 a second), namespace lists (a namespace's
// pods; every 2 s) and cluster-wide lists (all pods, all nodes; every 20 s), as clusterloader2's API
// responsiveness measurement counts calls of every kind. The channel closes when ctx ends and the probes have.
func probe(ctx context.Context, clients []kubernetes.Interface, namespaces []string, lat *sliRecorder) <-chan struct{} {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "probe"}, Data: map[string]string{"n": "0"}}
	clients[0].CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{})
	every := func(period time.Duration, sli string, call func(c kubernetes.Interface, i int) error) func() {
		return func() {
			tick := time.NewTicker(period)
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				t0 := time.Now()
				if err := call(clients[i%len(clients)], i); err == nil {
					lat.add(sli, time.Since(t0))
				} else if ctx.Err() == nil {
					lat.add(sli+"-errors", time.Since(t0))
				}
			}
		}
	}
	probes := []func(){
		every(200*time.Millisecond, "get", func(c kubernetes.Interface, i int) error {
			_, err := c.CoreV1().ConfigMaps("default").Get(ctx, "probe", metav1.GetOptions{})
			return err
		}),
		every(200*time.Millisecond, "get", func(c kubernetes.Interface, i int) error {
			_, err := c.CoreV1().Namespaces().Get(ctx, namespaces[i%len(namespaces)], metav1.GetOptions{})
			return err
		}),
		every(500*time.Millisecond, "mutating", func(c kubernetes.Interface, i int) error {
			cm := cm.DeepCopy()
			cm.Data["n"] = strconv.Itoa(i)
			_, err := c.CoreV1().ConfigMaps("default").Update(ctx, cm, metav1.UpdateOptions{})
			return err
		}),
		every(2*time.Second, "list-namespace", func(c kubernetes.Interface, i int) error {
			_, err := c.CoreV1().Pods(namespaces[i%len(namespaces)]).List(ctx, metav1.ListOptions{})
			return err
		}),
		every(20*time.Second, "list-cluster", func(c kubernetes.Interface, i int) error {
			if i%2 == 1 {
				_, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
				return err
			}
			_, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
			return err
		}),
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, p := range probes {
		wg.Add(1)
		go func() { defer wg.Done(); p() }()
	}
	go func() { wg.Wait(); close(done) }()
	return done
}

// scalePlan is the workload's objects, by namespace.
type scalePlan struct {
	deployments []*scaleDeployment
	jobs        []scaleObject
	daemonSet   string // its namespace
}

type scaleDeployment struct {
	ns, name string
	replicas int32
	service  bool
}

type scaleObject struct{ ns, name string }

// The sizes of clusterloader2's load config: big, medium and small groups.
const (
	bigGroup, mediumGroup, smallGroup = 250, 30, 5
	jobsPerSmallDeployments           = 20 // one small Job per 20 small Deployments
)

// planScale divides each namespace's share of the pods (less the DaemonSet's one per node) as the load
// config does: a quarter in big Deployments, a quarter in medium ones, the rest in small ones.
func planScale(namespaces []string, nodes int) *scalePlan {
	p := &scalePlan{daemonSet: namespaces[0]}
	perNS := nodes * (*scalePodsPerNode - 1) / len(namespaces)
	for _, ns := range namespaces {
		big := perNS / (4 * bigGroup)
		medium := perNS / (4 * mediumGroup)
		small := (perNS - big*bigGroup - medium*mediumGroup) / smallGroup
		n := 0
		add := func(count int, size int32, kind string) {
			for i := 0; i < count; i++ {
				p.deployments = append(p.deployments, &scaleDeployment{ns: ns, name: fmt.Sprintf("%s-%d", kind, i), replicas: size, service: n%2 == 0})
				n++
			}
		}
		add(big, bigGroup, "big")
		add(medium, mediumGroup, "medium")
		add(small, smallGroup, "small")
		for i := 0; i < max(1, small/jobsPerSmallDeployments); i++ {
			p.jobs = append(p.jobs, scaleObject{ns, fmt.Sprintf("job-%d", i)})
		}
	}
	return p
}

// runningPods is how many pods the Deployments ask for.
func (p *scalePlan) runningPods() int {
	n := 0
	for _, d := range p.deployments {
		n += int(d.replicas)
	}
	return n
}

type scaleOp func(ctx context.Context, c kubernetes.Interface) error

// creates are the saturation phase's calls, in the order a user applying the namespaces would make them:
// each Deployment's ConfigMap and Secret before it, its Service after; the Jobs and the DaemonSet last.
func (p *scalePlan) creates() []scaleOp {
	var ops []scaleOp
	for _, d := range p.deployments {
		d := d
		ops = append(ops, func(ctx context.Context, c kubernetes.Interface) error {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: d.name}, Data: map[string]string{"config": strings.Repeat("x", 64)}}
			_, err := c.CoreV1().ConfigMaps(d.ns).Create(ctx, cm, metav1.CreateOptions{})
			return err
		}, func(ctx context.Context, c kubernetes.Interface) error {
			s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: d.name}, Data: map[string][]byte{"secret": []byte(strings.Repeat("y", 64))}}
			_, err := c.CoreV1().Secrets(d.ns).Create(ctx, s, metav1.CreateOptions{})
			return err
		}, func(ctx context.Context, c kubernetes.Interface) error {
			_, err := c.AppsV1().Deployments(d.ns).Create(ctx, scaleDeploymentObject(d), metav1.CreateOptions{})
			return err
		})
		if d.service {
			ops = append(ops, func(ctx context.Context, c kubernetes.Interface) error {
				s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: d.name}, Spec: corev1.ServiceSpec{
					Selector: map[string]string{"app": d.name},
					Ports:    []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}}}
				_, err := c.CoreV1().Services(d.ns).Create(ctx, s, metav1.CreateOptions{})
				return err
			})
		}
	}
	for _, j := range p.jobs {
		j := j
		ops = append(ops, func(ctx context.Context, c kubernetes.Interface) error {
			n := int32(smallGroup)
			job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: j.name}, Spec: batchv1.JobSpec{Completions: &n, Parallelism: &n,
				Template: corev1.PodTemplateSpec{
					ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{nodeagent.SimulatedExitCodeAnnotation: "0"}},
					Spec:       corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{scaleContainer()}}}}}
			_, err := c.BatchV1().Jobs(j.ns).Create(ctx, job, metav1.CreateOptions{})
			return err
		})
	}
	ops = append(ops, func(ctx context.Context, c kubernetes.Interface) error {
		labels := map[string]string{"app": "daemon"}
		ds := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "daemon"}, Spec: appsv1.DaemonSetSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{scaleContainer()}}}}}
		_, err := c.AppsV1().DaemonSets(p.daemonSet).Create(ctx, ds, metav1.CreateOptions{})
		return err
	})
	return ops
}

// scale sets every Deployment to between 50% and 150% of its size (at least one pod) and returns the calls.
func (p *scalePlan) scale(rng *rand.Rand) []scaleOp {
	var ops []scaleOp
	for _, d := range p.deployments {
		d := d
		d.replicas = max(1, int32(float64(d.replicas)*(0.5+rng.Float64())))
		patch := []byte(fmt.Sprintf(`{"spec":{"replicas":%d}}`, d.replicas))
		ops = append(ops, func(ctx context.Context, c kubernetes.Interface) error {
			// As `kubectl scale` does: a patch, which no concurrent status update makes conflict.
			_, err := c.AppsV1().Deployments(d.ns).Patch(ctx, d.name, types.MergePatchType, patch, metav1.PatchOptions{}, "scale")
			return err
		})
	}
	return ops
}

func scaleContainer() corev1.Container {
	return corev1.Container{Name: "main", Image: "registry.local/bench:1.0", Ports: []corev1.ContainerPort{{ContainerPort: 8080}}}
}

func scaleDeploymentObject(d *scaleDeployment) *appsv1.Deployment {
	labels := map[string]string{"app": d.name}
	c := scaleContainer()
	c.VolumeMounts = []corev1.VolumeMount{{Name: "config", MountPath: "/etc/config"}, {Name: "secret", MountPath: "/etc/secret"}}
	replicas := d.replicas
	return &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: d.name}, Spec: appsv1.DeploymentSpec{
		Replicas: &replicas, Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{
			Containers: []corev1.Container{c},
			Volumes: []corev1.Volume{
				{Name: "config", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: d.name}}}},
				{Name: "secret", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: d.name}}},
			}}}}}
}

// podWatcher follows every pod through an informer: when it was first seen, and when it first ran with all
// containers ready.
type podWatcher struct {
	mu        sync.Mutex
	firstSeen map[string]time.Time
	boundAt   map[string]time.Time // first seen with a node
	started   map[string]time.Duration
	// toBound and boundToReady split each startup: first seen to first seen bound, then to Running and Ready.
	toBound, boundToReady map[string]time.Duration
	latency               map[string]bool // the latency pods (label group=latency)
	running               map[string]bool // pods Running and Ready now
	close                 chan struct{}
}

func watchPods(b *testing.B, client kubernetes.Interface) *podWatcher {
	w := &podWatcher{firstSeen: map[string]time.Time{}, boundAt: map[string]time.Time{}, started: map[string]time.Duration{},
		toBound: map[string]time.Duration{}, boundToReady: map[string]time.Duration{}, latency: map[string]bool{},
		running: map[string]bool{}, close: make(chan struct{})}
	factory := informers.NewSharedInformerFactory(client, 0)
	observe := func(obj any) {
		pod, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		now := time.Now()
		key := string(pod.UID)
		ready := pod.Status.Phase == corev1.PodRunning
		for _, cond := range pod.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status != corev1.ConditionTrue {
				ready = false
			}
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		if _, ok := w.firstSeen[key]; !ok {
			w.firstSeen[key] = now
			if pod.Labels[latencyLabel] == latencyGroup {
				w.latency[key] = true
			}
		}
		if _, ok := w.boundAt[key]; !ok && pod.Spec.NodeName != "" {
			w.boundAt[key] = now
		}
		if ready {
			if _, ok := w.started[key]; !ok {
				w.started[key] = now.Sub(w.firstSeen[key])
				w.toBound[key] = w.boundAt[key].Sub(w.firstSeen[key])
				w.boundToReady[key] = now.Sub(w.boundAt[key])
			}
		}
		if ready && pod.DeletionTimestamp == nil {
			w.running[key] = true
		} else {
			delete(w.running, key)
		}
	}
	gone := func(obj any) {
		if pod, ok := obj.(*corev1.Pod); ok {
			w.mu.Lock()
			delete(w.running, string(pod.UID))
			w.mu.Unlock()
		} else if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			if pod, ok := tomb.Obj.(*corev1.Pod); ok {
				w.mu.Lock()
				delete(w.running, string(pod.UID))
				w.mu.Unlock()
			}
		}
	}
	informer := factory.Core().V1().Pods().Informer()
	informer.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: observe, UpdateFunc: func(_, o any) { observe(o) }, DeleteFunc: gone})
	factory.Start(w.close)
	if !cache.WaitForCacheSync(w.close, informer.HasSynced) {
		b.Fatal("the pod informer never synced")
	}
	return w
}

func (w *podWatcher) stop() { close(w.close) }

// waitRunning waits until n pods run and are ready, and no more (a scale-down's pods have gone).
func (w *podWatcher) waitRunning(b *testing.B, n int, timeout time.Duration) {
	waitUntil(b, fmt.Sprintf("%d pods Running and Ready", n), timeout, func() (bool, string) {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.running) == n, fmt.Sprintf("%d running", len(w.running))
	})
}

// startups returns, for each started latency pod (or each other started pod), its time from first seen to
// Running and Ready, and that time in two parts: first seen to bound, then bound to Running and Ready.
func (w *podWatcher) startups(latency bool) (startup, toBound, boundToReady []time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for key, d := range w.started {
		if w.latency[key] == latency {
			startup = append(startup, d)
			toBound = append(toBound, w.toBound[key])
			boundToReady = append(boundToReady, w.boundToReady[key])
		}
	}
	return startup, toBound, boundToReady
}

// The label that marks the latency pods, as clusterloader2 marks them.
const latencyLabel, latencyGroup = "group", "latency"

// latencyPods runs clusterloader2's pod-startup-latency module on the saturated cluster, where running pods
// run: -scale.latency-pods one-replica Deployments spread over the namespaces, created at 5 a second (its
// Uniform5qps), waited for, then deleted, and waited for until only the saturation's pods run again.
// Their startups are the pod startup SLI's sample: the saturation's pods are created as fast as the workload
// goes, and clusterloader2 holds those to 1 h, not 5 s (its TODO, kubernetes/perf-tests#1024).
func latencyPods(b *testing.B, t *scaleTarget, namespaces []string, lat *sliRecorder, w *podWatcher, running int) {
	ctx := context.Background()
	n := *scaleLatencyPods
	if n <= 0 {
		return
	}
	t0 := time.Now()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	deployments := make([]*appsv1.Deployment, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		<-tick.C
		ns := namespaces[i%len(namespaces)]
		labels := map[string]string{latencyLabel: latencyGroup, "name": fmt.Sprintf("latency-%d", i)}
		one := int32(1)
		deployments[i] = &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: labels["name"], Namespace: ns, Labels: labels},
			Spec: appsv1.DeploymentSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: labels},
				Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
					Spec: corev1.PodSpec{Containers: []corev1.Container{scaleContainer()}}}}}
		wg.Go(func() { // at 5 a second whatever each call takes, as clusterloader2's qpsLoad
			t1 := time.Now()
			_, err := t.clients[i%3].AppsV1().Deployments(ns).Create(ctx, deployments[i], metav1.CreateOptions{})
			lat.add("mutating", time.Since(t1))
			if err != nil {
				errs <- fmt.Errorf("creating latency deployment %s/%s: %w", ns, deployments[i].Name, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	w.waitRunning(b, running+n, 15*time.Minute)
	b.Logf("latency pods: %d created at 5 a second, all running %v after the first", n, time.Since(t0).Round(time.Second))
	background := metav1.DeletePropagationBackground
	run(b, *scaleCreators, n, func(c, i int) error {
		d := deployments[i]
		t1 := time.Now()
		err := t.clients[c%3].AppsV1().Deployments(d.Namespace).Delete(ctx, d.Name, metav1.DeleteOptions{PropagationPolicy: &background})
		lat.add("mutating", time.Since(t1))
		return err
	})
	w.waitRunning(b, running, 15*time.Minute)
}

// storeRevision is the store's latest revision, from a consistent list's resourceVersion (Skiff's is the
// Raft index of the last write, etcd's its revision: both count writes).
func storeRevision(b *testing.B, client kubernetes.Interface) int64 {
	list, err := client.CoreV1().ConfigMaps("default").List(context.Background(), metav1.ListOptions{Limit: 1})
	if err != nil {
		b.Fatal(err)
	}
	rv, err := strconv.ParseInt(list.ResourceVersion, 10, 64)
	if err != nil {
		b.Fatalf("resourceVersion %q: %v", list.ResourceVersion, err)
	}
	return rv
}

// idleWriters watches the kinds a cluster writes on its own from revision rev for the window and counts the
// changes of each, so that the idle writes can be told apart.
func idleWriters(ctx context.Context, c kubernetes.Interface, rev int64, window time.Duration) map[string]int {
	ctx, cancel := context.WithTimeout(ctx, window)
	defer cancel()
	kinds := map[string]func(metav1.ListOptions) (watch.Interface, error){
		"nodes": func(o metav1.ListOptions) (watch.Interface, error) { return c.CoreV1().Nodes().Watch(ctx, o) },
		"leases": func(o metav1.ListOptions) (watch.Interface, error) {
			return c.CoordinationV1().Leases("").Watch(ctx, o)
		},
		"events": func(o metav1.ListOptions) (watch.Interface, error) { return c.CoreV1().Events("").Watch(ctx, o) },
		"pods":   func(o metav1.ListOptions) (watch.Interface, error) { return c.CoreV1().Pods("").Watch(ctx, o) },
		"endpointslices": func(o metav1.ListOptions) (watch.Interface, error) {
			return c.DiscoveryV1().EndpointSlices("").Watch(ctx, o)
		},
		"configmaps":  func(o metav1.ListOptions) (watch.Interface, error) { return c.CoreV1().ConfigMaps("").Watch(ctx, o) },
		"deployments": func(o metav1.ListOptions) (watch.Interface, error) { return c.AppsV1().Deployments("").Watch(ctx, o) },
		"replicasets": func(o metav1.ListOptions) (watch.Interface, error) { return c.AppsV1().ReplicaSets("").Watch(ctx, o) },
		"daemonsets":  func(o metav1.ListOptions) (watch.Interface, error) { return c.AppsV1().DaemonSets("").Watch(ctx, o) },
		"jobs":        func(o metav1.ListOptions) (watch.Interface, error) { return c.BatchV1().Jobs("").Watch(ctx, o) },
		"services":    func(o metav1.ListOptions) (watch.Interface, error) { return c.CoreV1().Services("").Watch(ctx, o) },
	}
	var mu sync.Mutex
	counts := map[string]int{}
	var wg sync.WaitGroup
	for kind, start := range kinds {
		w, err := start(metav1.ListOptions{ResourceVersion: strconv.FormatInt(rev, 10)})
		if err != nil {
			counts[kind+" (watch failed)"] = 0
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer w.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case ev, ok := <-w.ResultChan():
					if !ok {
						return
					}
					if ev.Type != watch.Bookmark && ev.Type != watch.Error {
						mu.Lock()
						counts[kind]++
						mu.Unlock()
					}
				}
			}
		}()
	}
	wg.Wait()
	return counts
}

// peakRSS is a process's peak resident memory (VmHWM).
func peakRSS(b *testing.B, pid int) int64 {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			kib, _ := strconv.ParseInt(strings.Fields(line)[1], 10, 64)
			return kib << 10
		}
	}
	return 0
}

// consistentListAfterJoin waits until the server whose admin kubeconfig is at path (it writes it once it
// has joined) serves a consistent list of namespaces, and returns how long that took.
func consistentListAfterJoin(b *testing.B, kubeconfig string) time.Duration {
	t0 := time.Now()
	var client kubernetes.Interface
	waitUntil(b, "a new server's consistent list", 10*time.Minute, func() (bool, string) {
		if client == nil {
			cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
			if err != nil {
				return false, err.Error()
			}
			client = kubernetes.NewForConfigOrDie(cfg)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
		return err == nil, fmt.Sprint(err)
	})
	return time.Since(t0)
}

// scaleTable is the rows as a Markdown table: the SLIs' p99 with whether each SLO held, and the costs.
func scaleTable(rows []scaleRow) string {
	var s strings.Builder
	s.WriteString("| system | nodes | pods running | mutating p99 | get p99 | list (ns) p99 | list (cluster) p99 | pod startup p50 / p99 | SLOs | saturation pods' startup p50 / p99 | saturation / churn | CPU s | peak RSS per server (machine) / all | idle writes per node per min | dead node → Unknown p50 / p99 | failover | restarted server reads | new server reads |\n")
	s.WriteString("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for _, r := range rows {
		var missed []string
		for _, slo := range scaleSLOs {
			if r.p99[slo.sli] > slo.limit {
				missed = append(missed, slo.sli)
			}
		}
		slos := "all held"
		if len(missed) > 0 {
			slos = "missed: " + strings.Join(missed, ", ")
		}
		d := func(sli string) string {
			if v, ok := r.p99[sli]; ok {
				return fmt.Sprintf("%.0f ms", ms(v))
			}
			return "-"
		}
		dead := "-"
		if r.deadNodes > 0 {
			dead = fmt.Sprintf("%.2f / %.2f s (%d nodes of %d hosts)", r.deadP50.Seconds(), r.deadP99.Seconds(), r.deadNodes, r.deadHosts)
		}
		join := "-"
		if r.joinRead > 0 {
			join = fmt.Sprintf("%.1f s", r.joinRead.Seconds())
		}
		fmt.Fprintf(&s, "| %s | %d | %d | %s | %s | %s | %s | %.0f / %.0f ms | %s | %.0f / %.0f ms | %.0f / %.0f s | %.0f | %.2f / %.2f GiB | %.2f | %s | %.2f s | %.1f s | %s |\n",
			r.system, r.nodes, r.pods, d("mutating"), d("get"), d("list-namespace"), d("list-cluster"), ms(r.startupP50), ms(r.p99["pod-startup"]),
			slos, ms(r.workloadStartupP50), ms(r.workloadStartupP99), r.saturation.Seconds(), r.churn.Seconds(), r.cpuSeconds, float64(r.peakRSS)/(1<<30), float64(r.peakRSSTotal)/(1<<30),
			r.idleWritesPerNodeMin, dead, r.failover.Seconds(), r.restartRead.Seconds(), join)
	}
	return s.String()
}

// podReady reports whether a pod is Running with its Ready condition true.
func podReady(pod *corev1.Pod) bool {
	if pod.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
