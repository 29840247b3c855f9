package bench

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/internal/testimages"
	"github.com/skiff-dev/skiff/localcluster"
)

var (
	programmingPods = flag.Int("netprog.pods", 100, "pods in the network programming latency benchmark")
	dnsQueries      = flag.Int("dns.queries", 20000, "queries in the cluster DNS benchmark")
	dnsWorkers      = flag.Int("dns.workers", 8, "concurrent resolvers in the cluster DNS benchmark")
)

// serverImage is the test server image the services benchmarks run, imported by the agents from --images.
const serverImage = "skiff.test/server:1"

// benchLocalCluster brings up `skiff local` with one server and two agents on the real runtime and the test
// server image, and brings it down when the benchmark ends.
func benchLocalCluster(b *testing.B) (*localcluster.State, kubernetes.Interface, string) {
	b.Helper()
	if os.Geteuid() != 0 {
		b.Skip("network namespaces and real pods need root")
	}
	dir, err := os.MkdirTemp("", "skiff-bench-svc-")
	if err != nil {
		b.Fatal(err)
	}
	images := filepath.Join(dir, "images")
	if err := os.MkdirAll(images, 0o700); err != nil {
		b.Fatal(err)
	}
	if err := testimages.WriteServerTarball(serverImage, filepath.Join(images, "server.tar")); err != nil {
		b.Fatal(err)
	}
	bin := proctest.Binary(b)
	out, err := exec.Command(bin, "local", "up", "--servers", "1", "--agents", "2", "--dir", dir, "--images", images).CombinedOutput()
	st, loadErr := localcluster.Load(dir)
	b.Cleanup(func() {
		if out, err := exec.Command(bin, "local", "down", "--dir", dir).CombinedOutput(); err != nil {
			b.Errorf("skiff local down: %v\n%s", err, out)
		}
		os.RemoveAll(dir)
	})
	if err != nil || loadErr != nil {
		b.Fatalf("skiff local up: %v %v\n%s", err, loadErr, out)
	}
	client := clientFor(b, st.Kubeconfig(dir))
	proctest.WaitFor(b, "both nodes Ready", 90*time.Second, func() error {
		for _, name := range []string{"agent-1", "agent-2"} {
			node, err := client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
			if err != nil || len(node.Status.Conditions) == 0 || node.Status.Conditions[0].Status != corev1.ConditionTrue {
				return fmt.Errorf("%s not Ready: %v", name, err)
			}
		}
		return nil
	})
	return st, client, dir
}

// inAgent runs a command in an agent host's network namespace.
func inAgent(st *localcluster.State, agent string, args ...string) ([]byte, error) {
	h, _ := st.Host(agent)
	return exec.Command("nsenter", append([]string{"--net=/run/netns/" + h.Netns, "--"}, args...)...).Output()
}

func serverPod(name, node string, labels map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{
			Name: "s", Image: serverImage, ImagePullPolicy: corev1.PullNever,
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}},
			ReadinessProbe: &corev1.Probe{PeriodSeconds: 1, ProbeHandler: corev1.ProbeHandler{
				HTTPGet: &corev1.HTTPGetAction{Path: "/ready", Port: intstr.FromString("http")}}},
		}}},
	}
}

func webService(ns string) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: ns}, Spec: corev1.ServiceSpec{
		Selector: map[string]string{"app": "web"},
		Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromString("http")}},
	}}
}

// BenchmarkNetworkProgramming measures Kubernetes' network programming latency SLI on `skiff local` (one
// server, two agents): from a pod being seen Ready (by an informer) to the DNAT rule for its endpoint being
// present in the nat table of every agent, p50 and p99 over -netprog.pods pods behind one Service, created one
// after another and placed on the two agents in turn; and the part of it until an EndpointSlice informer sees
// the endpoint ready (slice-p50-ms). Run it with -benchtime=1x.
func BenchmarkNetworkProgramming(b *testing.B) {
	st, client, _ := benchLocalCluster(b)
	ctx := context.Background()
	const ns = "default"
	if _, err := client.CoreV1().Services(ns).Create(ctx, webService(ns), metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	var mu sync.Mutex
	readyAt := map[string]time.Time{}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(ns))
	observe := func(obj any) {
		pod := obj.(*corev1.Pod)
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue && pod.Status.PodIP != "" {
				mu.Lock()
				if _, seen := readyAt[pod.Name]; !seen {
					readyAt[pod.Name] = time.Now()
				}
				mu.Unlock()
			}
		}
	}
	factory.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: observe, UpdateFunc: func(_, o any) { observe(o) }})
	// When each pod's endpoint is first seen ready in an EndpointSlice: splits the latency into the
	// controller's part and the proxies' part.
	sliceReadyAt := map[string]time.Time{}
	observeSlice := func(obj any) {
		slice := obj.(*discoveryv1.EndpointSlice)
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		for _, ep := range slice.Endpoints {
			if ep.TargetRef != nil && ep.Conditions.Ready != nil && *ep.Conditions.Ready {
				if _, seen := sliceReadyAt[ep.TargetRef.Name]; !seen {
					sliceReadyAt[ep.TargetRef.Name] = now
				}
			}
		}
	}
	factory.Discovery().V1().EndpointSlices().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: observeSlice, UpdateFunc: func(_, o any) { observeSlice(o) }})
	stop := make(chan struct{})
	defer close(stop)
	factory.Start(stop)
	factory.WaitForCacheSync(stop)

	var latencies, toSlice []time.Duration
	var polls int
	var pollTime time.Duration // reading the agents' rules: the measurement's own cost
	for b.Loop() {
		for i := range *programmingPods {
			name := fmt.Sprintf("web-%d", i)
			node := []string{"agent-1", "agent-2"}[i%2]
			if _, err := client.CoreV1().Pods(ns).Create(ctx, serverPod(name, node, map[string]string{"app": "web"}), metav1.CreateOptions{}); err != nil {
				b.Fatal(err)
			}
			var ready time.Time
			proctest.WaitFor(b, name+" Ready", 120*time.Second, func() error {
				mu.Lock()
				defer mu.Unlock()
				if t, ok := readyAt[name]; ok {
					ready = t
					return nil
				}
				return fmt.Errorf("not Ready")
			})
			pod, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				b.Fatal(err)
			}
			rule := "--to-destination " + pod.Status.PodIP + ":8080"
			var last time.Time
			for _, agent := range []string{"agent-1", "agent-2"} {
				proctest.WaitFor(b, name+"'s rule on "+agent, 60*time.Second, func() error {
					start := time.Now()
					out, err := inAgent(st, agent, "iptables-save", "-t", "nat")
					polls, pollTime = polls+1, pollTime+time.Since(start)
					if err != nil || !strings.Contains(string(out), rule) {
						return fmt.Errorf("no %q yet: %v", rule, err)
					}
					return nil
				})
				last = time.Now()
			}
			latencies = append(latencies, max(last.Sub(ready), 0))
			mu.Lock()
			if t, ok := sliceReadyAt[name]; ok {
				toSlice = append(toSlice, max(t.Sub(ready), 0))
			}
			mu.Unlock()
		}
	}
	p := func(l []time.Duration, q int) float64 {
		sort.Slice(l, func(i, j int) bool { return l[i] < l[j] })
		return float64(l[(len(l)-1)*q/100].Microseconds()) / 1000
	}
	b.ReportMetric(p(latencies, 50), "p50-ms")
	b.ReportMetric(p(latencies, 99), "p99-ms")
	if len(toSlice) > 0 {
		b.ReportMetric(p(toSlice, 50), "slice-p50-ms")
	}
	b.ReportMetric(float64(pollTime.Microseconds())/1000/float64(max(polls, 1)), "poll-ms")
	b.ReportMetric(float64(polls)/float64(max(len(latencies), 1)), "polls/pod")
	b.ReportMetric(float64(len(latencies)), "pods")
}

// BenchmarkClusterDNS measures the cluster DNS from a pod on `skiff local`: -dns.queries A queries for a
// Service's name over -dns.workers concurrent resolvers, sent to the pod's nameserver (the kube-dns ClusterIP,
// which the node's proxy sends to the node's CoreDNS); queries a second, p50 and p99 latency, and the CPU the
// agent process and the node DNS process (CoreDNS) used meanwhile, in percent of one core. Run it with
// -benchtime=1x.
func BenchmarkClusterDNS(b *testing.B) {
	st, client, dir := benchLocalCluster(b)
	ctx := context.Background()
	const ns = "default"
	if _, err := client.CoreV1().Services(ns).Create(ctx, webService(ns), metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	if _, err := client.CoreV1().Pods(ns).Create(ctx, serverPod("dns-client", "agent-1", nil), metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	var podIP string
	proctest.WaitFor(b, "dns-client Running", 120*time.Second, func() error {
		pod, err := client.CoreV1().Pods(ns).Get(ctx, "dns-client", metav1.GetOptions{})
		if err != nil || pod.Status.Phase != corev1.PodRunning || pod.Status.PodIP == "" {
			return fmt.Errorf("not Running: %v", err)
		}
		podIP = pod.Status.PodIP
		return nil
	})
	agent, _ := st.Host("agent-1")
	// The node's DNS turns ready a moment after the agent starts (CoreDNS's informers sync first); until
	// then the proxy drops queries to it. Measure once a query is answered.
	warm := fmt.Sprintf("http://%s:8080/dnsload?name=web.%s.svc.cluster.local.&n=1&c=1", podIP, ns)
	proctest.WaitFor(b, "the cluster DNS answering dns-client", 60*time.Second, func() error {
		out, err := inAgent(st, "agent-1", "curl", "-sS", "--max-time", "10", warm)
		if err != nil || !strings.Contains(string(out), `"failed":0`) {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	url := fmt.Sprintf("http://%s:8080/dnsload?name=web.%s.svc.cluster.local.&n=%d&c=%d", podIP, ns, *dnsQueries, *dnsWorkers)
	var result struct {
		Queries, Failed int
		Error           string
		QPS             float64
		P50US, P99US    int64
	}
	pidFile, err := os.ReadFile(filepath.Join(dir, "agent-1", "data", "dns", "pid"))
	if err != nil {
		b.Fatal(err)
	}
	var dnsPID int
	if _, err := fmt.Sscan(string(pidFile), &dnsPID); err != nil {
		b.Fatalf("the node DNS pid file: %v", err)
	}
	for b.Loop() {
		cpu0, dnsCPU0, t0 := processCPU(b, agent.PID), processCPU(b, dnsPID), time.Now()
		out, err := inAgent(st, "agent-1", "curl", "-sS", "--max-time", "600", url)
		if err != nil {
			b.Fatalf("%s: %v %s", url, err, out)
		}
		cpu, dnsCPU := processCPU(b, agent.PID)-cpu0, processCPU(b, dnsPID)-dnsCPU0
		if err := json.Unmarshal(out, &result); err != nil {
			b.Fatalf("%v: %s", err, out)
		}
		if result.Failed > 0 {
			b.Fatalf("%d of %d queries failed, first: %s", result.Failed, result.Queries, result.Error)
		}
		b.ReportMetric(result.QPS, "queries/s")
		b.ReportMetric(float64(result.P50US)/1000, "p50-ms")
		b.ReportMetric(float64(result.P99US)/1000, "p99-ms")
		elapsed := time.Since(t0).Seconds()
		b.ReportMetric(100*cpu.Seconds()/elapsed, "agent-cpu-%")
		b.ReportMetric(100*dnsCPU.Seconds()/elapsed, "node-dns-cpu-%")
	}
}

// processCPU is the CPU time a process has used so far.
func processCPU(b *testing.B, pid int) time.Duration {
	ticks, err := cpuTicks(pid)
	if err != nil {
		b.Fatal(err)
	}
	return time.Duration(ticks) * time.Second / 100 // USER_HZ is 100 on Linux
}
