package server

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/nodeagent/stats"
)

func TestAgentURL(t *testing.T) {
	node := func(port int32, addrs ...corev1.NodeAddress) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n"}}
		n.Status.Addresses = addrs
		n.Status.DaemonEndpoints.KubeletEndpoint.Port = port
		return n
	}
	internal := corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "10.0.0.5"}
	cases := []struct {
		name string
		node *corev1.Node
		want string // "" for none
	}{
		{"internal IP and port", node(10250, corev1.NodeAddress{Type: corev1.NodeHostName, Address: "n"}, internal), "https://10.0.0.5:10250"},
		{"IPv6", node(10250, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "fd00::5"}), "https://[fd00::5]:10250"},
		{"no port", node(0, internal), ""},
		{"no internal IP", node(10250, corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "1.2.3.4"}), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := agentURL(tc.node)
			if got != tc.want || ok != (tc.want != "") {
				t.Fatalf("agentURL = %q, %v; want %q", got, ok, tc.want)
			}
		})
	}
}

// fakeAgent is an agent's HTTPS endpoint serving whatever body it is given.
type fakeAgent struct {
	srv  *httptest.Server
	mu   sync.Mutex
	body string
	code int
}

func newFakeAgent(t *testing.T) *fakeAgent {
	a := &fakeAgent{code: http.StatusOK}
	a.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics/resource" {
			http.NotFound(w, r)
			return
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		w.WriteHeader(a.code)
		fmt.Fprint(w, a.body)
	}))
	t.Cleanup(a.srv.Close)
	return a
}

func (a *fakeAgent) serve(code int, body string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.code, a.body = code, body
}

// node is a Node whose agent endpoint is the fake agent's.
func (a *fakeAgent) node(t *testing.T, name string) *corev1.Node {
	host, port, err := net.SplitHostPort(a.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(port)
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: host}}
	n.Status.DaemonEndpoints.KubeletEndpoint.Port = int32(p)
	return n
}

// sample is a kubelet /metrics/resource body: node CPU seconds, and per container of pod default/web
// "name=cpu" pairs, all at time ms; sidecar started at sidecarStart.
func sample(ms int64, nodeCPU float64, nginxCPU, sidecarCPU float64, sidecarStart int) string {
	return fmt.Sprintf(`# HELP container_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the container in core-seconds
# TYPE container_cpu_usage_seconds_total counter
container_cpu_usage_seconds_total{container="nginx",namespace="default",pod="web"} %[3]g %[1]d
container_cpu_usage_seconds_total{container="sidecar",namespace="default",pod="web"} %[4]g %[1]d
# HELP container_memory_working_set_bytes [STABLE] Current working set of the container in bytes
# TYPE container_memory_working_set_bytes gauge
container_memory_working_set_bytes{container="nginx",namespace="default",pod="web"} 6.7108864e+07 %[1]d
container_memory_working_set_bytes{container="sidecar",namespace="default",pod="web"} 8.388608e+06 %[1]d
# HELP container_start_time_seconds [STABLE] Start time of the container since unix epoch in seconds
# TYPE container_start_time_seconds gauge
container_start_time_seconds{container="nginx",namespace="default",pod="web"} 1.6999e+09
container_start_time_seconds{container="sidecar",namespace="default",pod="web"} %[5]d
# HELP node_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the node in core-seconds
# TYPE node_cpu_usage_seconds_total counter
node_cpu_usage_seconds_total %[2]g %[1]d
# HELP node_memory_working_set_bytes [STABLE] Current working set of the node in bytes
# TYPE node_memory_working_set_bytes gauge
node_memory_working_set_bytes 1.073741824e+09 %[1]d
# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise
# TYPE resource_scrape_error gauge
resource_scrape_error 0
`, ms, nodeCPU, nginxCPU, sidecarCPU, sidecarStart)
}

// TestMetricsScraper scrapes a fake agent over TLS through successive samples and checks the figures as
// metrics-server would give them: nothing after one sample, rates over the samples' timestamps after two,
// a restarted container holding its pod back for one round, a failing agent withdrawing its node's figures,
// and a removed Node forgotten.
func TestMetricsScraper(t *testing.T) {
	agent := newFakeAgent(t)
	var nodes []*corev1.Node
	nodes = append(nodes, agent.node(t, "n1"))
	var mu sync.Mutex
	s := newMetricsScraper(agent.srv.Client(), func() ([]*corev1.Node, error) {
		mu.Lock()
		defer mu.Unlock()
		return nodes, nil
	}, nil, hclog.NewNullLogger())
	ctx := context.Background()
	const t0 = 1_700_000_000_000 // ms
	type want struct {
		nodeMilli, nginxMilli, sidecarMilli int64 // -1: no figures
		window                              time.Duration
		ts                                  int64
	}
	check := func(step string, w want) {
		t.Helper()
		nm, ok := s.NodeMetrics("n1")
		if ok != (w.nodeMilli >= 0) {
			t.Fatalf("%s: node metrics %v, want %v", step, ok, w.nodeMilli >= 0)
		}
		if ok {
			if cpu := nm.Usage.Cpu().MilliValue(); cpu != w.nodeMilli || nm.Usage.Memory().Value() != 1<<30 ||
				nm.Window.Duration != w.window || nm.Timestamp.UnixMilli() != w.ts {
				t.Errorf("%s: node %s cpu, %s memory, window %v at %d; want %dm, 1Gi, %v at %d",
					step, nm.Usage.Cpu(), nm.Usage.Memory(), nm.Window.Duration, nm.Timestamp.UnixMilli(), w.nodeMilli, w.window, w.ts)
			}
		}
		pm, ok := s.PodMetrics("default", "web")
		if ok != (w.nginxMilli >= 0) {
			t.Fatalf("%s: pod metrics %v, want %v", step, ok, w.nginxMilli >= 0)
		}
		if ok {
			if len(pm.Containers) != 2 || pm.Containers[0].Name != "nginx" || pm.Containers[1].Name != "sidecar" {
				t.Fatalf("%s: containers %+v", step, pm.Containers)
			}
			nginx, sidecar := pm.Containers[0].Usage, pm.Containers[1].Usage
			if nginx.Cpu().MilliValue() != w.nginxMilli || sidecar.Cpu().MilliValue() != w.sidecarMilli ||
				nginx.Memory().Value() != 64<<20 || pm.Window.Duration != w.window || pm.Timestamp.UnixMilli() != w.ts {
				t.Errorf("%s: pod nginx %s/%s sidecar %s, window %v at %d; want %dm/64Mi, %dm, %v at %d", step,
					nginx.Cpu(), nginx.Memory(), sidecar.Cpu(), pm.Window.Duration, pm.Timestamp.UnixMilli(), w.nginxMilli, w.sidecarMilli, w.window, w.ts)
			}
		}
	}
	steps := []struct {
		name string
		code int
		body string
		want want
	}{
		{"first sample", 200, sample(t0, 1000, 10, 1, 1_699_990_000), want{-1, -1, -1, 0, 0}},
		// 15 s later: node +3 s = 200m, nginx +1.5 s = 100m, sidecar +0.15 s = 10m.
		{"second sample", 200, sample(t0+15_000, 1003, 11.5, 1.15, 1_699_990_000), want{200, 100, 10, 15 * time.Second, t0 + 15_000}},
		// The agent has not read anything new: the same sample again changes nothing.
		{"same sample", 200, sample(t0+15_000, 1003, 11.5, 1.15, 1_699_990_000), want{200, 100, 10, 15 * time.Second, t0 + 15_000}},
		// The sidecar restarted, its counter began again (though above the old one's last figure): the pod
		// waits for the new sidecar's next sample.
		{"sidecar restarted", 200, sample(t0+30_000, 1006, 13, 2, 1_700_000_020), want{200, -1, -1, 15 * time.Second, t0 + 30_000}},
		{"after the restart", 200, sample(t0+40_000, 1008, 14, 2.1, 1_700_000_020), want{200, 100, 10, 10 * time.Second, t0 + 40_000}},
		{"agent failing", 500, "boom", want{-1, -1, -1, 0, 0}},
		// The samples survive a failed scrape: the next success has a rate over the longer window.
		{"agent back", 200, sample(t0+60_000, 1012, 16, 2.3, 1_700_000_020), want{200, 100, 10, 20 * time.Second, t0 + 60_000}},
	}
	for _, step := range steps {
		agent.serve(step.code, step.body)
		s.scrape(ctx)
		check(step.name, step.want)
	}

	mu.Lock()
	nodes = nil
	mu.Unlock()
	s.scrape(ctx)
	check("node removed", want{-1, -1, -1, 0, 0})
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.scraped) != 0 || len(s.podUsage) != 0 {
		t.Fatalf("a removed node is remembered: %v, %v", s.scraped, s.podUsage)
	}
}

// TestMetricsScraperReadsAgent: what the agent's stats handler writes is what the scraper reads.
func TestMetricsScraperReadsAgent(t *testing.T) {
	root := t.TempDir()
	for path, content := range map[string]string{
		"proc/stat":                       "cpu  100 0 100 5000 0 0 0 0 0 0\n",
		"proc/meminfo":                    "MemTotal: 2048 kB\nMemFree: 1024 kB\n",
		"cgroup/memory.stat":              "inactive_file 0\n",
		"cgroup/skiff/c1/cpu.stat":        "usage_usec 1500000\n",
		"cgroup/skiff/c1/memory.current":  "4096\n",
		"cgroup/skiff/c1/memory.stat":     "inactive_file 1024\n",
		"cgroup/skiff/sbx/cpu.stat":       "usage_usec 1\n",
		"cgroup/skiff/sbx/memory.current": "1\n",
		"cgroup/skiff/sbx/memory.stat":    "inactive_file 0\n",
	} {
		full := filepath.Join(root, path)
		os.MkdirAll(filepath.Dir(full), 0o755)
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	reader := &stats.Reader{CgroupRoot: filepath.Join(root, "cgroup"), ProcRoot: filepath.Join(root, "proc"), Parent: "skiff", V2: true}
	start := time.Now().Add(-time.Hour).Truncate(time.Second)
	h := stats.Handler(reader, func() []stats.Container {
		return []stats.Container{
			{Namespace: "ns", Pod: "p", PodUID: "u", ID: "sbx"},
			{Namespace: "ns", Pod: "p", PodUID: "u", Name: "app", ID: "c1", StartTime: start},
		}
	})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics/resource", nil))
	before := time.Now()
	sc, err := parseResourceMetrics(strings.NewReader(rec.Body.String()), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if sc.node == nil || sc.node.cpu != 2 || sc.node.memory != 1024*1024 || sc.node.at.IsZero() || sc.node.at.After(before) {
		t.Errorf("node point %+v", sc.node)
	}
	app := sc.containers[containerRef{podRef{"ns", "p"}, "app"}]
	if len(sc.containers) != 1 || app.cpu != 1.5 || app.memory != 3072 || !app.start.Equal(start) || app.at.IsZero() {
		t.Errorf("container points %+v:\n%s", sc.containers, rec.Body.String())
	}
}
