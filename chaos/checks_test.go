package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/skiff-dev/skiff/localcluster"
)

// fakeServer answers the few endpoints the checks use, as a Skiff server would.
type fakeServer struct {
	mu      sync.Mutex
	state   *raftState // nil: the state endpoint is missing (404)
	metrics string     // the /metrics body
	writes  int        // the status for creates: 201 or an error
}

func (f *fakeServer) set(applied uint64, hash string, goroutines int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.state = &raftState{AppliedIndex: applied, StateHash: hash, Goroutines: goroutines}
}

func (f *fakeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	status := func(code int) {
		w.WriteHeader(code)
		fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","code":%d}`, code)
	}
	switch {
	case r.URL.Path == raftStatePath && f.state != nil:
		json.NewEncoder(w).Encode(f.state)
	case r.URL.Path == "/metrics" && f.metrics != "":
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, f.metrics)
	case r.Method == http.MethodPost && r.URL.Path == "/api/v1/namespaces/default/configmaps":
		if f.writes != http.StatusCreated {
			status(f.writes)
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"x","namespace":"default"}}`)
	case r.Method == http.MethodDelete:
		io.WriteString(w, `{"kind":"Status","apiVersion":"v1","status":"Success"}`)
	default:
		status(http.StatusNotFound)
	}
}

// fakeCluster starts n fake servers and a kubeconfig with a context for each, s0 and on.
func fakeCluster(t *testing.T, n int) ([]*fakeServer, string) {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	var fakes []*fakeServer
	for i := range n {
		f := &fakeServer{writes: http.StatusCreated}
		srv := httptest.NewServer(f)
		t.Cleanup(srv.Close)
		name := fmt.Sprintf("s%d", i)
		cfg.Clusters[name] = &clientcmdapi.Cluster{Server: srv.URL}
		cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{}
		cfg.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
		cfg.CurrentContext = name
		fakes = append(fakes, f)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return fakes, path
}

func TestCheckConvergence(t *testing.T) {
	ctx := context.Background()
	fakes, kubeconfig := fakeCluster(t, 3)
	for _, f := range fakes {
		f.set(100, "aaaa", 50)
	}
	if err := CheckConvergence(ctx, kubeconfig, time.Second); err != nil {
		t.Fatal(err)
	}

	// A server behind catches up.
	fakes[2].set(90, "bbbb", 50)
	go func() {
		time.Sleep(300 * time.Millisecond)
		fakes[2].set(100, "aaaa", 50)
	}()
	if err := CheckConvergence(ctx, kubeconfig, 5*time.Second); err != nil {
		t.Fatal(err)
	}

	// A server that stays behind.
	fakes[2].set(90, "bbbb", 50)
	err := CheckConvergence(ctx, kubeconfig, 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "did not converge") || !strings.Contains(err.Error(), "s2: applied=90 hash=bbbb") {
		t.Fatalf("got %v", err)
	}

	// A server with another state at the same index.
	fakes[1].set(100, "cccc", 50)
	err = CheckConvergence(ctx, kubeconfig, 5*time.Second)
	if err == nil || !strings.Contains(err.Error(), "diverged: at applied index 100 s0 has state hash aaaa but s1 has cccc") {
		t.Fatalf("got %v", err)
	}

	// A server down.
	fakes[1].mu.Lock()
	fakes[1].state = nil
	fakes[1].mu.Unlock()
	err = CheckConvergence(ctx, kubeconfig, 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "s1: the server could not find the requested resource") {
		t.Fatalf("got %v", err)
	}
}

func TestGoroutines(t *testing.T) {
	ctx := context.Background()
	fakes, kubeconfig := fakeCluster(t, 2)
	fakes[0].set(1, "a", 120)
	// s1 has no state endpoint: its metrics are read.
	fakes[1].metrics = "# HELP go_goroutines Number of goroutines.\n# TYPE go_goroutines gauge\ngo_goroutines 345\ngo_threads 12\n"
	counts, err := GoroutineCounts(ctx, kubeconfig)
	if err != nil || counts["s0"] != 120 || counts["s1"] != 345 {
		t.Fatalf("counts %v, %v", counts, err)
	}
	old := goroutineSettle
	goroutineSettle = 0
	t.Cleanup(func() { goroutineSettle = old })
	if err := CheckGoroutines(ctx, kubeconfig, map[string]int{"s0": 100, "s1": 300, "gone": 1}, 50); err != nil {
		t.Fatal(err)
	}
	err = CheckGoroutines(ctx, kubeconfig, map[string]int{"s0": 100, "s1": 200}, 50)
	if err == nil || !strings.Contains(err.Error(), "s1 runs 345 goroutines; at the round's start the most was 200 (s1), slack 50") || strings.Contains(err.Error(), "s0") {
		t.Fatalf("got %v", err)
	}
	// A follower that took over the leader's work may run what the leader ran.
	fakes[0].set(1, "a", 330)
	if err := CheckGoroutines(ctx, kubeconfig, map[string]int{"s0": 100, "s1": 300}, 50); err != nil {
		t.Fatalf("a server within the busiest one's count: %v", err)
	}
}

func TestParseGoroutinesMetric(t *testing.T) {
	if n, err := parseGoroutinesMetric([]byte("go_gc_duration_seconds 1\ngo_goroutines 1.234e+03\n")); err != nil || n != 1234 {
		t.Fatalf("%d, %v", n, err)
	}
	if _, err := parseGoroutinesMetric([]byte("go_threads 3\n")); err == nil {
		t.Fatal("no error without the metric")
	}
}

func TestCheckWritesResume(t *testing.T) {
	ctx := context.Background()
	fakes, kubeconfig := fakeCluster(t, 2)
	took, err := CheckWritesResume(ctx, kubeconfig, time.Second)
	if err != nil || took <= 0 || took > time.Second {
		t.Fatalf("took %v, %v", took, err)
	}
	fakes[1].writes = http.StatusInternalServerError
	took, err = CheckWritesResume(ctx, kubeconfig, 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "through s1:") || strings.Contains(err.Error(), "s0") || took < 300*time.Millisecond {
		t.Fatalf("took %v, %v", took, err)
	}
}

func TestCheckNodeTransitions(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	const s = time.Second
	tr := func(node string, from, to corev1.ConditionStatus, d time.Duration) NodeTransition {
		return NodeTransition{Node: node, From: from, To: to, At: at(d), Seen: at(d)}
	}
	const T, U, F = corev1.ConditionTrue, corev1.ConditionUnknown, corev1.ConditionFalse
	initial := []NodeTransition{tr("agent-1", "", T, -60*s), tr("agent-2", "", T, -60*s)}
	killed := AgentFault{Node: "agent-1", Kind: "kill", Start: at(0), End: at(60 * s), MustDetect: true}
	cases := []struct {
		name   string
		trans  []NodeTransition
		faults []AgentFault
		want   string // empty: passes
	}{
		{"killed agent detected and back", []NodeTransition{tr("agent-1", T, U, 4*s), tr("agent-1", U, T, 65*s)}, []AgentFault{killed}, ""},
		{"no fault, no Unknown", []NodeTransition{tr("agent-2", T, F, 5*s), tr("agent-2", F, T, 9*s)}, nil, ""},
		{"already Unknown when the fault started", []NodeTransition{tr("agent-1", T, U, -10*s)},
			[]AgentFault{{Node: "agent-1", Kind: "kill", Start: at(-12 * s), End: at(-11 * s)}, killed}, ""},
		{"a short fault need not be detected", nil, []AgentFault{{Node: "agent-1", Kind: "kill", Start: at(0), End: at(10 * s), MustDetect: true}}, ""},
		{"a partial partition need not be detected", nil, []AgentFault{{Node: "agent-1", Kind: "partition", Start: at(0), End: at(60 * s)}}, ""},
		{"Unknown just after the heal", []NodeTransition{tr("agent-1", T, U, 62*s)}, []AgentFault{{Node: "agent-1", Kind: "pause", Start: at(0), End: at(60 * s)}}, ""},
		{"a fault still in force at the end", []NodeTransition{tr("agent-1", T, U, 30*s)}, []AgentFault{{Node: "agent-1", Kind: "kill", Start: at(0), MustDetect: true}}, ""},
		{"Unknown without a fault", []NodeTransition{tr("agent-2", T, U, 10*s)}, []AgentFault{killed},
			"node agent-2 went True->Unknown at 12:00:10 (seen 12:00:10.000, reason \"\") while no fault hit its agent"},
		{"Unknown long after the heal", []NodeTransition{tr("agent-1", T, U, 4*s), tr("agent-1", U, T, 65*s), tr("agent-1", T, U, 110*s)},
			[]AgentFault{killed}, "node agent-1 went True->Unknown at 12:01:50"},
		{"killed agent never detected", []NodeTransition{tr("agent-1", T, F, 5*s)}, []AgentFault{killed},
			"node agent-1: kill at 12:00:00, but no Node went Unknown within 40s (transitions: agent-1 (first seen)->True () at 11:59:00, agent-1 True->False () at 12:00:05)"},
		{"killed agent detected too late", []NodeTransition{tr("agent-1", T, U, 50*s)}, []AgentFault{killed},
			"no Node went Unknown within 40s"},
		{"an agent not known: any Node", []NodeTransition{tr("agent-2", T, U, 10*s)}, []AgentFault{{Kind: "kill-agent", Start: at(0), End: at(60 * s), MustDetect: true}}, ""},
		{"an agent not known, outside the fault", []NodeTransition{tr("agent-2", T, U, 100*s)}, []AgentFault{{Kind: "netem", Start: at(0), End: at(20 * s)}},
			"node agent-2 went True->Unknown at 12:01:40"},
		{"an agent not known, never detected", nil, []AgentFault{{Kind: "kill-agent", Start: at(0), End: at(60 * s), MustDetect: true}},
			"node (any): kill-agent at 12:00:00, but no Node went Unknown within 40s"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			trans := append(append([]NodeTransition{}, initial...), tc.trans...)
			err := CheckNodesNotUnknownDuringFailover(trans, tc.faults, 40*s, at(120*s))
			switch {
			case tc.want == "" && err != nil:
				t.Fatal(err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// TestNodeWatchCheck checks the runner's FaultRecords by fault name.
func TestNodeWatchCheck(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	const s = time.Second
	watchWith := func(trans ...NodeTransition) *NodeWatch {
		done := make(chan struct{})
		close(done)
		return &NodeWatch{cancel: func() {}, done: done, trans: trans, stopped: at(120 * s)}
	}
	unknown := NodeTransition{Node: "agent-2", From: corev1.ConditionTrue, To: corev1.ConditionUnknown, At: at(10 * s), Seen: at(10 * s)}
	cases := []struct {
		name    string
		faulted []FaultRecord
		want    string
	}{
		{"a leader failover leaves the Nodes alone", []FaultRecord{{Name: "kill-leader", Start: at(0), End: at(20 * s)}}, "node agent-2 went True->Unknown"},
		{"an agent partition may make them Unknown", []FaultRecord{{Name: "partition-agents", Start: at(0), End: at(20 * s)}}, ""},
		{"a fault not known may too", []FaultRecord{{Name: "new-fault", Start: at(0), End: at(20 * s)}}, ""},
		{"a killed agent is detected", []FaultRecord{{Name: "kill-agent", Start: at(0), End: at(60 * s)}}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := watchWith(unknown).Check(tc.faulted)
			switch {
			case tc.want == "" && err != nil:
				t.Fatal(err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
	err := watchWith().Check([]FaultRecord{{Name: "kill-agent", Start: at(0), End: at(60 * s)}})
	if err == nil || !strings.Contains(err.Error(), "kill-agent at 12:00:00, but no Node went Unknown within 40s") {
		t.Fatalf("got %v", err)
	}
}

func TestNodeWatchBadKubeconfig(t *testing.T) {
	nw := StartNodeWatch(context.Background(), filepath.Join(t.TempDir(), "missing"))
	if err := nw.Check(nil); err == nil || !strings.Contains(err.Error(), "node watch") {
		t.Fatalf("got %v", err)
	}
}

func TestContainerKind(t *testing.T) {
	const uid = "0b5e5a6e-4f5c-4d7e-9a1b-2c3d4e5f6a7b"
	for id, want := range map[string]string{
		uid + "-sandbox":         "sandbox",
		uid + "-app-web-0":       "app",
		uid + "-init-setup-db-2": "init",
		"short-app-x-0":          "",
	} {
		if got := containerKind(id); got != want {
			t.Errorf("containerKind(%q) = %q, want %q", id, got, want)
		}
	}
}

// fakeAgentTasks makes an agent's runtime state as the shims leave it: a bundle per task. A task whose pid
// is this process runs.
func fakeAgentTasks(t *testing.T, dir, host string, tasks map[string]string) {
	t.Helper()
	bundles := filepath.Join(dir, host, "data", "containerd", "state", "io.containerd.runtime.v2.task", podContainerdNamespace)
	for id, hostname := range tasks {
		d := filepath.Join(bundles, id)
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		spec := fmt.Sprintf(`{"ociVersion":"1.1.0","hostname":%q}`, hostname)
		if err := os.WriteFile(filepath.Join(d, "config.json"), []byte(spec), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, "init.pid"), []byte(fmt.Sprint(os.Getpid())), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPodRunsTwice reads the agents' tasks from their bundles (no containerd answers: the agents were
// killed, their containers run on) and finds a pod running on two agents.
func TestPodRunsTwice(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	local := &Local{Dir: dir, State: &localcluster.State{Hosts: []localcluster.Host{
		{Name: "server-1", Role: "server"}, {Name: "agent-1", Role: "agent"}, {Name: "agent-2", Role: "agent"}, {Name: "agent-3", Role: "agent"},
	}}}
	const uid1, uid2 = "11111111-1111-1111-1111-111111111111", "22222222-2222-2222-2222-222222222222"
	fakeAgentTasks(t, dir, "agent-1", map[string]string{uid1 + "-sandbox": "web-0", uid1 + "-app-web-0": "web-0"})
	fakeAgentTasks(t, dir, "agent-2", map[string]string{uid2 + "-sandbox": "web-0", uid2 + "-init-setup-0": "web-0"})
	// A task that exited: its shim's pid is gone.
	fakeAgentTasks(t, dir, "agent-3", map[string]string{uid2 + "-app-web-0": "web-0"})
	if err := os.WriteFile(filepath.Join(dir, "agent-3", "data", "containerd", "state", "io.containerd.runtime.v2.task", podContainerdNamespace, uid2+"-app-web-0", "init.pid"), []byte("999999999"), 0o600); err != nil {
		t.Fatal(err)
	}

	cs, err := RunningContainers(ctx, local)
	if err != nil || len(cs) != 4 {
		t.Fatalf("%+v, %v", cs, err)
	}
	for _, c := range cs {
		if c.Source != "bundle" || c.PodName != "web-0" || c.Host == "agent-3" {
			t.Fatalf("%+v", c)
		}
	}
	// Only init and sandbox containers run on agent-2: no pod runs twice.
	if err := CheckNoPodRunsTwice(ctx, local, nil); err != nil {
		t.Fatal(err)
	}

	ps := StartPodSampler(ctx, local, "default", []string{"web-0"}, 20*time.Millisecond)
	time.Sleep(50 * time.Millisecond)
	fakeAgentTasks(t, dir, "agent-2", map[string]string{uid2 + "-app-web-0": "web-0"})
	time.Sleep(100 * time.Millisecond)
	if err := CheckNoPodRunsTwice(ctx, local, []string{"web-0"}); err == nil || !strings.Contains(err.Error(), "pod web-0 runs on agent-1 and agent-2 at once") {
		t.Fatalf("got %v", err)
	}
	if err := CheckNoPodRunsTwice(ctx, local, []string{"web-1"}); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "agent-2", "data", "containerd", "state", "io.containerd.runtime.v2.task", podContainerdNamespace, uid2+"-app-web-0")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	err = ps.Stop()
	if err == nil || !strings.Contains(err.Error(), "pod web-0 ran on agent-1 and agent-2 at once, from") {
		t.Fatalf("got %v", err)
	}
	if err := CheckNoPodRunsTwice(ctx, local, []string{"web-0"}); err != nil {
		t.Fatal(err)
	}
}
