package nodeagent

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/record"
)

// fakeExecer answers exec probes with a per-container exit code that tests flip.
type fakeExecer struct {
	mu    sync.Mutex
	codes map[string]int
	delay time.Duration
	calls atomic.Int32
}

func newFakeExecer() *fakeExecer { return &fakeExecer{codes: map[string]int{}} }

func (f *fakeExecer) set(containerID string, code int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.codes[containerID] = code
}

func (f *fakeExecer) Exec(ctx context.Context, containerID string, cmd []string) (int, []byte, error) {
	f.calls.Add(1)
	f.mu.Lock()
	code, ok := f.codes[containerID]
	delay := f.delay
	f.mu.Unlock()
	if delay > 0 {
		select {
		case <-ctx.Done():
			return -1, nil, ctx.Err()
		case <-time.After(delay):
		}
	}
	if !ok {
		return 0, nil, errors.New("no such container " + containerID)
	}
	if code != 0 {
		return code, []byte("exit " + strconv.Itoa(code) + " from " + strings.Join(cmd, " ")), nil
	}
	return 0, []byte("ok"), nil
}

func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// hostPort splits an httptest or listener URL into host and port.
func hostPort(t *testing.T, raw string) (string, int) {
	t.Helper()
	if u, err := url.Parse(raw); err == nil && u.Host != "" {
		raw = u.Host
	}
	host, port, err := net.SplitHostPort(raw)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(port)
	return host, n
}

func probePod(ip string, containers ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: types.UID("uid-1")},
		Spec:       corev1.PodSpec{Containers: containers},
		Status:     corev1.PodStatus{PodIP: ip},
	}
}

func httpGetProbe(path string, port intstr.IntOrString) *corev1.Probe {
	return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: path, Port: port}}}
}

func TestProbeHTTP(t *testing.T) {
	var gotUA, gotHeader, gotAccept atomic.Value
	mux := http.NewServeMux()
	mux.HandleFunc("/ok", func(w http.ResponseWriter, r *http.Request) {
		gotUA.Store(r.UserAgent())
		gotHeader.Store(r.Header.Get("X-Custom"))
		gotAccept.Store(r.Header.Get("Accept"))
	})
	mux.HandleFunc("/fail", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusInternalServerError) })
	mux.HandleFunc("/redirect-ok", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/ok", http.StatusFound) })
	mux.HandleFunc("/redirect-fail", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/fail", http.StatusFound) })
	mux.HandleFunc("/loop", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/loop", http.StatusFound) })
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	host, port := hostPort(t, srv.URL)
	// A redirect to another host ("localhost" rather than 127.0.0.1) is not followed: the 302 is a success.
	mux.HandleFunc("/redirect-elsewhere", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "http://localhost:"+strconv.Itoa(port)+"/fail", http.StatusFound)
	})
	tlsSrv := httptest.NewTLSServer(mux)
	defer tlsSrv.Close()
	_, tlsPort := hostPort(t, tlsSrv.URL)

	c := &corev1.Container{Name: "app", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: int32(port)}}}
	pod := probePod(host, *c)

	tests := []struct {
		name    string
		probe   *corev1.Probe
		ok      bool
		output  string // substring
		maxTime time.Duration
	}{
		{name: "200", probe: httpGetProbe("/ok", intstr.FromInt32(int32(port))), ok: true},
		{name: "500", probe: httpGetProbe("/fail", intstr.FromInt32(int32(port))), output: "HTTP probe failed with statuscode: 500"},
		{name: "404", probe: httpGetProbe("/missing", intstr.FromInt32(int32(port))), output: "statuscode: 404"},
		{name: "named port", probe: httpGetProbe("/ok", intstr.FromString("http")), ok: true},
		{name: "numeric string port", probe: httpGetProbe("/ok", intstr.FromString(strconv.Itoa(port))), ok: true},
		{name: "unknown named port", probe: httpGetProbe("/ok", intstr.FromString("metrics")), output: `couldn't find port "metrics"`},
		{name: "redirect followed to success", probe: httpGetProbe("/redirect-ok", intstr.FromInt32(int32(port))), ok: true},
		{name: "redirect followed to failure", probe: httpGetProbe("/redirect-fail", intstr.FromInt32(int32(port))), output: "statuscode: 500"},
		{name: "redirect loop", probe: httpGetProbe("/loop", intstr.FromInt32(int32(port))), output: "stopped after 10 redirects"},
		{name: "redirect to another host not followed", probe: httpGetProbe("/redirect-elsewhere", intstr.FromInt32(int32(port))), ok: true},
		{name: "https skips verification", probe: func() *corev1.Probe {
			p := httpGetProbe("/ok", intstr.FromInt32(int32(tlsPort)))
			p.HTTPGet.Scheme = corev1.URISchemeHTTPS
			return p
		}(), ok: true},
		{name: "timeout", probe: func() *corev1.Probe {
			p := httpGetProbe("/slow", intstr.FromInt32(int32(port)))
			p.TimeoutSeconds = 1
			return p
		}(), output: "deadline exceeded", maxTime: 3 * time.Second},
		{name: "explicit host", probe: func() *corev1.Probe {
			p := httpGetProbe("/ok", intstr.FromInt32(int32(port)))
			p.HTTPGet.Host = host
			return p
		}(), ok: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			ok, out := runProbe(context.Background(), livenessProbe, tc.probe, pod, c, "cid", nil)
			if ok != tc.ok || !strings.Contains(out, tc.output) {
				t.Fatalf("runProbe = %v, %q; want %v, containing %q", ok, out, tc.ok, tc.output)
			}
			if tc.maxTime > 0 && time.Since(start) > tc.maxTime {
				t.Fatalf("probe took %s, want under %s", time.Since(start), tc.maxTime)
			}
		})
	}

	t.Run("headers", func(t *testing.T) {
		p := httpGetProbe("/ok", intstr.FromInt32(int32(port)))
		p.HTTPGet.HTTPHeaders = []corev1.HTTPHeader{{Name: "X-Custom", Value: "yes"}}
		if ok, out := runProbe(context.Background(), readinessProbe, p, pod, c, "cid", nil); !ok {
			t.Fatalf("probe failed: %s", out)
		}
		if ua, _ := gotUA.Load().(string); ua != "kube-probe/1.32" {
			t.Errorf("User-Agent = %q", ua)
		}
		if h, _ := gotHeader.Load().(string); h != "yes" {
			t.Errorf("X-Custom = %q", h)
		}
		if h, _ := gotAccept.Load().(string); h != "*/*" {
			t.Errorf("Accept = %q", h)
		}
		p.HTTPGet.HTTPHeaders = []corev1.HTTPHeader{{Name: "User-Agent", Value: "mine"}}
		runProbe(context.Background(), readinessProbe, p, pod, c, "cid", nil)
		if ua, _ := gotUA.Load().(string); ua != "mine" {
			t.Errorf("User-Agent = %q, want the probe's own", ua)
		}
	})

	t.Run("no pod IP", func(t *testing.T) {
		p := httpGetProbe("/ok", intstr.FromInt32(int32(port)))
		if outcome, _ := probeOnce(context.Background(), readinessProbe, p, probePod("", *c), c, "cid", nil); outcome != probeSkipped {
			t.Fatalf("outcome = %v, want skipped", outcome)
		}
	})
}

func TestProbeTCP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			conn.Close()
		}
	}()
	host, port := hostPort(t, ln.Addr().String())
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, closedPort := hostPort(t, closed.Addr().String())
	closed.Close()

	c := &corev1.Container{Name: "db", Ports: []corev1.ContainerPort{{Name: "sql", ContainerPort: int32(port)}}}
	pod := probePod(host, *c)
	tcp := func(port intstr.IntOrString) *corev1.Probe {
		return &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: port}}}
	}
	if ok, out := runProbe(context.Background(), livenessProbe, tcp(intstr.FromInt32(int32(port))), pod, c, "cid", nil); !ok {
		t.Errorf("listening port: %s", out)
	}
	if ok, out := runProbe(context.Background(), livenessProbe, tcp(intstr.FromString("sql")), pod, c, "cid", nil); !ok {
		t.Errorf("named port: %s", out)
	}
	ok, out := runProbe(context.Background(), livenessProbe, tcp(intstr.FromInt32(int32(closedPort))), pod, c, "cid", nil)
	if want := "dial tcp 127.0.0.1:" + strconv.Itoa(closedPort) + ": connect: connection refused"; ok || out != want {
		t.Errorf("closed port = %v, %q; want false, %q", ok, out, want)
	}
}

func TestProbeExecAndOthers(t *testing.T) {
	ex := newFakeExecer()
	ex.set("good", 0)
	ex.set("bad", 2)
	c := &corev1.Container{Name: "app"}
	pod := probePod("10.0.0.5", *c)
	exec := &corev1.Probe{ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"cat", "/tmp/healthy"}}}}
	if ok, out := runProbe(context.Background(), livenessProbe, exec, pod, c, "good", ex); !ok {
		t.Errorf("exit 0 failed: %s", out)
	}
	if ok, out := runProbe(context.Background(), livenessProbe, exec, pod, c, "bad", ex); ok || out != "exit 2 from cat /tmp/healthy" {
		t.Errorf("exit 2 = %v, %q", ok, out)
	}
	if outcome, out := probeOnce(context.Background(), livenessProbe, exec, pod, c, "gone", ex); outcome != probeErrored || !strings.Contains(out, "no such container") {
		t.Errorf("exec error = %v, %q; want errored", outcome, out)
	}
	slow := &fakeExecer{codes: map[string]int{"good": 0}, delay: 5 * time.Second}
	start := time.Now()
	if ok, out := runProbe(context.Background(), livenessProbe, exec, pod, c, "good", slow); ok || !strings.Contains(out, "timed out") {
		t.Errorf("slow exec = %v, %q; want a timeout", ok, out)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("exec timeout took %s", d)
	}
	if startupProbe.String() != "Startup" || livenessProbe.String() != "Liveness" || readinessProbe.String() != "Readiness" {
		t.Error("probeType names")
	}
}

// managerFixture is a probe manager with a fake execer, a fake recorder and a counter of onChange calls.
type managerFixture struct {
	m        *probeManager
	ex       *fakeExecer
	recorder *record.FakeRecorder
	changes  atomic.Int32
	mu       sync.Mutex
	events   []string
}

func newManagerFixture(t *testing.T) *managerFixture {
	f := &managerFixture{ex: newFakeExecer(), recorder: record.NewFakeRecorder(10000)}
	f.m = newProbeManager(f.ex, f.recorder, func(*corev1.Pod) { f.changes.Add(1) })
	t.Cleanup(func() {
		f.m.stop()
		if n := f.m.active.Load(); n != 0 {
			t.Errorf("%d probe workers still running after stop", n)
		}
	})
	return f
}

// eventList drains the recorder and returns every event seen so far.
func (f *managerFixture) eventList() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	for {
		select {
		case e := <-f.recorder.Events:
			f.events = append(f.events, e)
		default:
			return append([]string(nil), f.events...)
		}
	}
}

func (f *managerFixture) hasEvent(prefix string) bool {
	for _, e := range f.eventList() {
		if strings.HasPrefix(e, prefix) {
			return true
		}
	}
	return false
}

func execProbe1s(failureThreshold int32) *corev1.Probe {
	return &corev1.Probe{
		ProbeHandler:  corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"check"}}},
		PeriodSeconds: 1, FailureThreshold: failureThreshold,
	}
}

func TestProbeManagerReadiness(t *testing.T) {
	t.Parallel()
	f := newManagerFixture(t)
	pod := probePod("10.0.0.5", corev1.Container{Name: "app", ReadinessProbe: execProbe1s(2)})
	f.ex.set("c1", 1)
	if f.m.ready(pod.UID, "app", "c1") {
		t.Fatal("ready before the manager knew the pod")
	}
	f.m.update(pod, map[string]runningContainer{"app": {ID: "c1", StartedAt: time.Now()}})
	if got := f.changes.Load(); got != 1 {
		t.Errorf("onChange calls after update of a pod asked about early = %d, want 1", got)
	}
	if !f.m.started(pod.UID, "app", "c1") {
		t.Error("not started without a startup probe")
	}
	eventually(t, 5*time.Second, "an Unhealthy event", func() bool {
		return f.hasEvent("Warning Unhealthy Readiness probe failed: exit 1 from check")
	})
	if f.m.ready(pod.UID, "app", "c1") {
		t.Fatal("ready while the probe fails")
	}
	f.ex.set("c1", 0)
	eventually(t, 5*time.Second, "ready", func() bool { return f.m.ready(pod.UID, "app", "c1") })
	if f.m.ready(pod.UID, "app", "other") {
		t.Error("ready for another container ID")
	}
	changes := f.changes.Load()
	if changes < 2 {
		t.Errorf("onChange not called when ready flipped")
	}
	f.ex.set("c1", 1)
	eventually(t, 6*time.Second, "not ready", func() bool { return !f.m.ready(pod.UID, "app", "c1") })
	if f.changes.Load() == changes {
		t.Error("onChange not called when readiness flipped back")
	}
	if failed, _ := f.m.livenessFailed(pod.UID, "app", "c1"); failed {
		t.Error("readiness failure reported as a liveness failure")
	}
	// The readiness worker keeps probing after a failure.
	f.ex.set("c1", 0)
	eventually(t, 5*time.Second, "ready again", func() bool { return f.m.ready(pod.UID, "app", "c1") })
}

func TestProbeManagerLiveness(t *testing.T) {
	t.Parallel()
	f := newManagerFixture(t)
	pod := probePod("10.0.0.5",
		corev1.Container{Name: "app", LivenessProbe: execProbe1s(2)},
		corev1.Container{Name: "plain"})
	f.ex.set("c1", 0)
	f.m.update(pod, map[string]runningContainer{"app": {ID: "c1", StartedAt: time.Now()}, "plain": {ID: "p1"}})
	if !f.m.ready(pod.UID, "app", "c1") || !f.m.ready(pod.UID, "plain", "p1") || !f.m.started(pod.UID, "plain", "p1") {
		t.Fatal("containers without readiness or startup probes are ready and started")
	}
	eventually(t, 5*time.Second, "a probe", func() bool { return f.ex.calls.Load() >= 1 })
	if failed, _ := f.m.livenessFailed(pod.UID, "app", "c1"); failed {
		t.Fatal("liveness failed while succeeding")
	}
	f.ex.set("c1", 137)
	eventually(t, 6*time.Second, "a liveness failure", func() bool {
		failed, _ := f.m.livenessFailed(pod.UID, "app", "c1")
		return failed
	})
	_, msg := f.m.livenessFailed(pod.UID, "app", "c1")
	if msg != "Liveness probe failed: exit 137 from check" {
		t.Errorf("message = %q", msg)
	}
	if f.changes.Load() == 0 {
		t.Error("onChange not called on the liveness failure")
	}
	// The worker stops probing the failed container.
	eventually(t, 3*time.Second, "the worker to stop", func() bool { return f.m.active.Load() == 0 })
	calls := f.ex.calls.Load()
	time.Sleep(1500 * time.Millisecond)
	if f.ex.calls.Load() != calls {
		t.Error("still probing a container whose liveness failed")
	}
	if failed, _ := f.m.livenessFailed(pod.UID, "app", "c1"); !failed {
		t.Error("the failure must last until the container is replaced")
	}
	// The restarted container starts afresh.
	f.ex.set("c2", 0)
	f.m.update(pod, map[string]runningContainer{"app": {ID: "c2", StartedAt: time.Now()}, "plain": {ID: "p1"}})
	if failed, _ := f.m.livenessFailed(pod.UID, "app", "c2"); failed {
		t.Error("new container inherits the liveness failure")
	}
	if failed, _ := f.m.livenessFailed(pod.UID, "app", "c1"); failed {
		t.Error("result of a replaced container kept")
	}
	eventually(t, 3*time.Second, "a new worker", func() bool { return f.m.active.Load() == 1 })
	n := 0
	for _, e := range f.eventList() {
		if strings.HasPrefix(e, "Warning Unhealthy Liveness probe failed:") {
			n++
		}
	}
	if n < 2 {
		t.Errorf("%d Unhealthy events, want one per failed attempt (2)", n)
	}
}

func TestProbeManagerStartupGating(t *testing.T) {
	t.Parallel()
	f := newManagerFixture(t)
	startup := &corev1.Probe{
		ProbeHandler: corev1.ProbeHandler{Exec: &corev1.ExecAction{Command: []string{"started"}}}, PeriodSeconds: 1, FailureThreshold: 30,
	}
	pod := probePod("10.0.0.5", corev1.Container{Name: "app", StartupProbe: startup, LivenessProbe: execProbe1s(1), ReadinessProbe: execProbe1s(1)})
	f.ex.set("c1", 1)
	f.m.update(pod, map[string]runningContainer{"app": {ID: "c1", StartedAt: time.Now()}})
	eventually(t, 5*time.Second, "two startup failures", func() bool {
		n := 0
		for _, e := range f.eventList() {
			if strings.HasPrefix(e, "Warning Unhealthy Startup probe failed:") {
				n++
			}
		}
		return n >= 2
	})
	// Liveness (threshold 1) would have failed by now had it run.
	for _, e := range f.eventList() {
		if !strings.HasPrefix(e, "Warning Unhealthy Startup") {
			t.Fatalf("event before startup succeeded: %s", e)
		}
	}
	if f.m.started(pod.UID, "app", "c1") || f.m.ready(pod.UID, "app", "c1") {
		t.Fatal("started or ready before the startup probe succeeded")
	}
	if failed, _ := f.m.livenessFailed(pod.UID, "app", "c1"); failed {
		t.Fatal("liveness failed before startup")
	}
	f.ex.set("c1", 0)
	eventually(t, 5*time.Second, "started and ready", func() bool {
		return f.m.started(pod.UID, "app", "c1") && f.m.ready(pod.UID, "app", "c1")
	})
	// The startup worker is done; liveness and readiness go on.
	eventually(t, 3*time.Second, "two workers", func() bool { return f.m.active.Load() == 2 })
	f.ex.set("c1", 1)
	eventually(t, 5*time.Second, "liveness failure", func() bool {
		failed, msg := f.m.livenessFailed(pod.UID, "app", "c1")
		return failed && strings.HasPrefix(msg, "Liveness probe failed:")
	})
	if !f.m.started(pod.UID, "app", "c1") {
		t.Error("startup result lost")
	}
}

func TestProbeManagerStartupFailure(t *testing.T) {
	t.Parallel()
	f := newManagerFixture(t)
	startup := execProbe1s(2)
	pod := probePod("10.0.0.5", corev1.Container{Name: "app", StartupProbe: startup, ReadinessProbe: execProbe1s(1)})
	f.ex.set("c1", 3)
	f.m.update(pod, map[string]runningContainer{"app": {ID: "c1", StartedAt: time.Now()}})
	eventually(t, 6*time.Second, "startup failure", func() bool {
		failed, _ := f.m.livenessFailed(pod.UID, "app", "c1")
		return failed
	})
	if _, msg := f.m.livenessFailed(pod.UID, "app", "c1"); msg != "Startup probe failed: exit 3 from check" {
		t.Errorf("message = %q", msg)
	}
	if f.m.started(pod.UID, "app", "c1") {
		t.Error("started after the startup probe failed")
	}
	// Restarted container: fresh, and its startup can succeed.
	f.ex.set("c2", 0)
	f.m.update(pod, map[string]runningContainer{"app": {ID: "c2", StartedAt: time.Now()}})
	eventually(t, 5*time.Second, "new container ready", func() bool { return f.m.ready(pod.UID, "app", "c2") })
	if failed, _ := f.m.livenessFailed(pod.UID, "app", "c2"); failed {
		t.Error("new container inherits the startup failure")
	}
}

func TestProbeManagerInitialDelayAndThresholds(t *testing.T) {
	t.Parallel()
	f := newManagerFixture(t)
	readiness := execProbe1s(3)
	readiness.InitialDelaySeconds = 2
	readiness.SuccessThreshold = 2
	pod := probePod("10.0.0.5", corev1.Container{Name: "app", ReadinessProbe: readiness})
	f.ex.set("c1", 0)
	start := time.Now()
	f.m.update(pod, map[string]runningContainer{"app": {ID: "c1", StartedAt: start}})
	time.Sleep(1200 * time.Millisecond)
	if n := f.ex.calls.Load(); n != 0 {
		t.Fatalf("%d probes during the initial delay", n)
	}
	eventually(t, 6*time.Second, "ready", func() bool { return f.m.ready(pod.UID, "app", "c1") })
	if f.ex.calls.Load() < 2 {
		t.Errorf("ready after %d successes, want successThreshold 2", f.ex.calls.Load())
	}
	// A container that started long ago is probed at once.
	pod2 := probePod("10.0.0.6", corev1.Container{Name: "app", ReadinessProbe: readiness})
	pod2.UID = "uid-2"
	f.ex.set("d1", 0)
	f.m.update(pod2, map[string]runningContainer{"app": {ID: "d1", StartedAt: time.Now().Add(-time.Minute)}})
	eventually(t, 3*time.Second, "ready", func() bool { return f.m.ready(pod2.UID, "app", "d1") })
}

// TestProbeManagerRemovePodAndStop is not parallel: it counts the process's goroutines.
func TestProbeManagerRemovePodAndStop(t *testing.T) {
	base := runtime.NumGoroutine()
	f := newManagerFixture(t)
	var pods []*corev1.Pod
	for i := 0; i < 5; i++ {
		pod := probePod("10.0.0.5", corev1.Container{Name: "app",
			StartupProbe: execProbe1s(100), LivenessProbe: execProbe1s(3), ReadinessProbe: execProbe1s(3)})
		pod.UID = types.UID("uid-" + strconv.Itoa(i))
		id := "c" + strconv.Itoa(i)
		f.ex.set(id, 0)
		f.m.update(pod, map[string]runningContainer{"app": {ID: id, StartedAt: time.Now()}})
		pods = append(pods, pod)
	}
	// The startup probes succeed at once and their workers end; liveness and readiness go on.
	eventually(t, 5*time.Second, "10 workers", func() bool { return f.m.active.Load() == 10 })
	f.m.removePod(pods[0].UID)
	eventually(t, 3*time.Second, "workers of the removed pod to stop", func() bool { return f.m.active.Load() == 8 })
	if f.m.ready(pods[0].UID, "app", "c0") {
		t.Error("removed pod still has results")
	}
	// A container that stopped running loses its workers.
	f.m.update(pods[1], map[string]runningContainer{})
	eventually(t, 3*time.Second, "workers of the stopped container to stop", func() bool { return f.m.active.Load() == 6 })
	f.m.stop()
	if n := f.m.active.Load(); n != 0 {
		t.Fatalf("%d workers after stop", n)
	}
	f.m.update(pods[2], map[string]runningContainer{"app": {ID: "c9"}})
	if n := f.m.active.Load(); n != 0 {
		t.Fatalf("update after stop started %d workers", n)
	}
	eventually(t, 5*time.Second, "goroutines to settle", func() bool { return runtime.NumGoroutine() <= base })
}

func TestProbeManagerHTTPWorker(t *testing.T) {
	t.Parallel()
	var healthy atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !healthy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	host, port := hostPort(t, srv.URL)
	f := newManagerFixture(t)
	p := httpGetProbe("/healthz", intstr.FromString("http"))
	p.PeriodSeconds = 1
	pod := probePod(host, corev1.Container{Name: "app", ReadinessProbe: p,
		Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: int32(port)}}})
	f.m.update(pod, map[string]runningContainer{"app": {ID: "c1", StartedAt: time.Now()}})
	eventually(t, 5*time.Second, "an Unhealthy event", func() bool {
		return f.hasEvent("Warning Unhealthy Readiness probe failed: HTTP probe failed with statuscode: 503")
	})
	healthy.Store(true)
	eventually(t, 5*time.Second, "ready", func() bool { return f.m.ready(pod.UID, "app", "c1") })
}
