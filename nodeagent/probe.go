package nodeagent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/tools/record"
)

// probeType is one of a container's three probes.
type probeType int

const (
	startupProbe probeType = iota
	livenessProbe
	readinessProbe
)

var probeTypes = [...]probeType{startupProbe, livenessProbe, readinessProbe}

func (t probeType) String() string {
	switch t {
	case startupProbe:
		return "Startup"
	case livenessProbe:
		return "Liveness"
	case readinessProbe:
		return "Readiness"
	}
	return "Unknown"
}

// probeOf is a container's probe of the given type, or nil.
func probeOf(c *corev1.Container, kind probeType) *corev1.Probe {
	if c == nil {
		return nil
	}
	switch kind {
	case startupProbe:
		return c.StartupProbe
	case livenessProbe:
		return c.LivenessProbe
	case readinessProbe:
		return c.ReadinessProbe
	}
	return nil
}

// execer runs a command inside a running container (the runtime implements it with a containerd exec).
// It should return when ctx ends; a command that ran and exited reports its exit code with a nil error.
type execer interface {
	Exec(ctx context.Context, containerID string, cmd []string) (exitCode int, output []byte, err error)
}

const (
	probeUserAgent      = "kube-probe/1.32"
	probeMaxRedirects   = 10
	probeMaxBody        = 10 << 10 // read at most this much of an HTTP probe's response body
	probeMaxOutput      = 512      // keep at most this much of a probe's output for events and messages
	defaultProbeTimeout = time.Second
	defaultProbePeriod  = 10 * time.Second
	defaultProbeFailure = 3
)

// probeOutcome is what one probe attempt found.
type probeOutcome int

const (
	probeSucceeded probeOutcome = iota
	probeFailed
	// probeErrored: the probe could not be run as specified (unknown named port, unsupported handler, runtime
	// error). As in the kubelet, the attempt does not move the result either way, but it is reported.
	probeErrored
	// probeSkipped: the probe cannot run yet (no pod IP); silently retried at the next period.
	probeSkipped
)

// probeTransport is shared by all HTTP probes: no keep-alives (every probe opens its own connection, as the
// kubelet's do), no proxy, and no certificate verification for HTTPS.
var probeTransport = &http.Transport{
	Proxy:              nil,
	DialContext:        (&net.Dialer{}).DialContext,
	TLSClientConfig:    &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the kubelet does not verify probe targets
	DisableKeepAlives:  true,
	DisableCompression: true,
}

// runProbe runs one probe attempt (exec, httpGet, tcpSocket or grpc) within the probe's
// timeoutSeconds (default 1 s) and reports whether it succeeded, with a short output or reason for events.
func runProbe(ctx context.Context, kind probeType, p *corev1.Probe, pod *corev1.Pod, c *corev1.Container, containerID string, ex execer) (ok bool, output string) {
	outcome, out := probeOnce(ctx, kind, p, pod, c, containerID, ex)
	return outcome == probeSucceeded, out
}

func probeOnce(ctx context.Context, _ probeType, p *corev1.Probe, pod *corev1.Pod, c *corev1.Container, containerID string, ex execer) (probeOutcome, string) {
	if p == nil {
		return probeErrored, "no probe"
	}
	timeout := seconds(p.TimeoutSeconds, defaultProbeTimeout)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch {
	case p.Exec != nil:
		return execProbe(ctx, p.Exec, containerID, ex, timeout)
	case p.HTTPGet != nil:
		return httpProbe(ctx, p.HTTPGet, pod, c, timeout)
	case p.TCPSocket != nil:
		return tcpProbe(ctx, p.TCPSocket, pod, c)
	case p.GRPC != nil:
		return grpcProbe(ctx, p.GRPC, pod, timeout)
	}
	return probeErrored, "probe has no handler"
}

func execProbe(ctx context.Context, a *corev1.ExecAction, containerID string, ex execer, timeout time.Duration) (probeOutcome, string) {
	if len(a.Command) == 0 {
		return probeErrored, "exec probe has no command"
	}
	if ex == nil {
		return probeErrored, "exec probes are not supported by this runtime"
	}
	cmd := append([]string(nil), a.Command...)
	code, out, err := ex.Exec(ctx, containerID, cmd)
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return probeFailed, fmt.Sprintf("command %q timed out after %s", strings.Join(cmd, " "), timeout)
	}
	if err != nil {
		return probeErrored, shorten(err.Error())
	}
	if code == 0 {
		return probeSucceeded, shorten(string(out))
	}
	if s := shorten(string(out)); s != "" {
		return probeFailed, s
	}
	return probeFailed, fmt.Sprintf("command %q exited with %d", strings.Join(cmd, " "), code)
}

func httpProbe(ctx context.Context, a *corev1.HTTPGetAction, pod *corev1.Pod, c *corev1.Container, timeout time.Duration) (probeOutcome, string) {
	port, err := probePort(a.Port, c)
	if err != nil {
		return probeErrored, err.Error()
	}
	host := a.Host
	if host == "" {
		if host = podIP(pod); host == "" {
			return probeSkipped, "pod has no IP address yet"
		}
	}
	scheme := strings.ToLower(string(a.Scheme))
	if scheme == "" {
		scheme = "http"
	}
	path := a.Path
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	u, err := url.Parse(path)
	if err != nil {
		u = &url.URL{Path: path}
	}
	u.Scheme, u.Host = scheme, net.JoinHostPort(host, strconv.Itoa(port))

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return probeErrored, err.Error()
	}
	for _, h := range a.HTTPHeaders {
		req.Header.Add(h.Name, h.Value)
	}
	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header.Set("User-Agent", probeUserAgent)
	}
	if _, ok := req.Header["Accept"]; !ok {
		req.Header.Set("Accept", "*/*")
	} else if req.Header.Get("Accept") == "" {
		req.Header.Del("Accept")
	}
	if h := req.Header.Get("Host"); h != "" {
		req.Host = h
	}
	client := &http.Client{Transport: probeTransport, Timeout: timeout, CheckRedirect: sameHostRedirects}
	res, err := client.Do(req)
	if err != nil {
		return probeFailed, shorten(err.Error())
	}
	defer res.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, probeMaxBody))
	if res.StatusCode >= http.StatusOK && res.StatusCode < http.StatusBadRequest {
		return probeSucceeded, ""
	}
	return probeFailed, fmt.Sprintf("HTTP probe failed with statuscode: %d", res.StatusCode)
}

// sameHostRedirects follows redirects to the same host (up to 10); a redirect elsewhere is not followed and
// its 3xx answer is the probe's result, a success, as in the kubelet.
func sameHostRedirects(req *http.Request, via []*http.Request) error {
	if len(via) >= probeMaxRedirects {
		return fmt.Errorf("stopped after %d redirects", probeMaxRedirects)
	}
	if req.URL.Hostname() != via[0].URL.Hostname() {
		return http.ErrUseLastResponse
	}
	return nil
}

func tcpProbe(ctx context.Context, a *corev1.TCPSocketAction, pod *corev1.Pod, c *corev1.Container) (probeOutcome, string) {
	port, err := probePort(a.Port, c)
	if err != nil {
		return probeErrored, err.Error()
	}
	host := a.Host
	if host == "" {
		if host = podIP(pod); host == "" {
			return probeSkipped, "pod has no IP address yet"
		}
	}
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return probeFailed, shorten(err.Error())
	}
	_ = conn.Close()
	return probeSucceeded, ""
}

// probePort resolves a probe's port: a number, or the name of one of the container's ports (or, as the
// kubelet accepts, a number written as a string).
func probePort(p intstr.IntOrString, c *corev1.Container) (int, error) {
	n := 0
	switch p.Type {
	case intstr.Int:
		n = int(p.IntVal)
	case intstr.String:
		found := false
		if c != nil {
			for _, cp := range c.Ports {
				if cp.Name == p.StrVal {
					n, found = int(cp.ContainerPort), true
					break
				}
			}
		}
		if !found {
			v, err := strconv.Atoi(p.StrVal)
			if err != nil {
				return 0, fmt.Errorf("couldn't find port %q in the container's ports", p.StrVal)
			}
			n = v
		}
	}
	if n <= 0 || n > 65535 {
		return 0, fmt.Errorf("invalid port number: %d", n)
	}
	return n, nil
}

func podIP(pod *corev1.Pod) string {
	if pod == nil {
		return ""
	}
	if pod.Status.PodIP != "" {
		return pod.Status.PodIP
	}
	if len(pod.Status.PodIPs) > 0 {
		return pod.Status.PodIPs[0].IP
	}
	return ""
}

func seconds(s int32, def time.Duration) time.Duration {
	if s <= 0 {
		return def
	}
	return time.Duration(s) * time.Second
}

func shorten(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > probeMaxOutput {
		s = s[:probeMaxOutput] + "..."
	}
	return s
}

// runningContainer is a running container as the probe manager needs it.
type runningContainer struct {
	ID        string
	StartedAt time.Time
}

// probeResult is a worker's current verdict.
type probeResult int

const (
	resultUnknown probeResult = iota
	resultSuccess
	resultFailure
)

type probeKey struct {
	container string
	kind      probeType
}

// probeManager runs one worker goroutine per (pod, container, probe type) that has a probe, as the kubelet's
// prober workers do. Results belong to a container ID, so a restarted container starts afresh.
type probeManager struct {
	ex       execer
	recorder record.EventRecorder
	onChange func(pod *corev1.Pod)

	mu      sync.Mutex
	closed  bool
	pods    map[types.UID]*corev1.Pod
	workers map[types.UID]map[probeKey]*probeWorker
	// askedEarly holds pods asked about before update told of them; update then calls onChange for them,
	// since the answers given (not started, not ready) may have been wrong.
	askedEarly map[types.UID]bool

	wg     sync.WaitGroup
	active atomic.Int32 // worker goroutines running, for tests
}

// newProbeManager builds a manager. recorder may be nil (no events). onChange is called, from worker
// goroutines and without locks held, whenever a result flips; it must not block (enqueue the pod).
func newProbeManager(ex execer, recorder record.EventRecorder, onChange func(pod *corev1.Pod)) *probeManager {
	return &probeManager{
		ex: ex, recorder: recorder, onChange: onChange,
		pods:       map[types.UID]*corev1.Pod{},
		workers:    map[types.UID]map[probeKey]*probeWorker{},
		askedEarly: map[types.UID]bool{},
	}
}

// probedContainer finds a container that may have probes: a regular one, or a restartable init container
// (sidecar).
func probedContainer(pod *corev1.Pod, name string) *corev1.Container {
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			return &pod.Spec.Containers[i]
		}
	}
	for i := range pod.Spec.InitContainers {
		c := &pod.Spec.InitContainers[i]
		if c.Name == name && c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			return c
		}
	}
	return nil
}

// update tells the manager about a pod (its latest version, whose status.podIP HTTP and TCP probes use by
// default) and its running containers, by name. It starts workers for newly started containers and stops
// those of containers that stopped or changed ID, dropping their results. Call it after each sync, and
// before reading results for the containers it started.
func (m *probeManager) update(pod *corev1.Pod, running map[string]runningContainer) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	uid := pod.UID
	_, known := m.pods[uid]
	notify := !known && m.askedEarly[uid]
	delete(m.askedEarly, uid)
	m.pods[uid] = pod

	ws := m.workers[uid]
	for key, w := range ws {
		rc, ok := running[key.container]
		if !ok || rc.ID != w.containerID || probeOf(probedContainer(pod, key.container), key.kind) == nil {
			w.stopLocked()
			delete(ws, key)
		}
	}
	add := func(c *corev1.Container) {
		rc, ok := running[c.Name]
		if !ok || rc.ID == "" {
			return
		}
		for _, kind := range probeTypes {
			p := probeOf(c, kind)
			if p == nil {
				continue
			}
			key := probeKey{c.Name, kind}
			if _, ok := ws[key]; ok {
				continue
			}
			if ws == nil {
				ws = map[probeKey]*probeWorker{}
				m.workers[uid] = ws
			}
			w := m.newWorker(uid, c, kind, p, rc)
			ws[key] = w
			m.wg.Add(1)
			go w.run()
		}
	}
	for i := range pod.Spec.InitContainers {
		if c := &pod.Spec.InitContainers[i]; c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			add(c)
		}
	}
	for i := range pod.Spec.Containers {
		add(&pod.Spec.Containers[i])
	}
	if len(ws) == 0 {
		delete(m.workers, uid)
	}
	m.mu.Unlock()
	if notify && m.onChange != nil {
		m.onChange(pod)
	}
}

// removePod stops a pod's workers and forgets it and its results.
func (m *probeManager) removePod(uid types.UID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, w := range m.workers[uid] {
		w.stopLocked()
	}
	delete(m.workers, uid)
	delete(m.pods, uid)
	delete(m.askedEarly, uid)
}

// stop stops every worker and waits for them to return (agent shutdown). The manager is unusable after.
func (m *probeManager) stop() {
	m.mu.Lock()
	m.closed = true
	for uid, ws := range m.workers {
		for _, w := range ws {
			w.stopLocked()
		}
		delete(m.workers, uid)
	}
	m.mu.Unlock()
	m.wg.Wait()
}

// worker is the pod's worker of a container's probe for that container ID, or nil.
func (m *probeManager) worker(uid types.UID, container, containerID string, kind probeType) *probeWorker {
	if w := m.workers[uid][probeKey{container, kind}]; w != nil && w.containerID == containerID {
		return w
	}
	return nil
}

// started tells whether a container has started: true when it has no startupProbe or it succeeded. A pod
// the manager has not been told about (update) is not started.
func (m *probeManager) started(uid types.UID, container, containerID string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.startedLocked(uid, container, containerID)
}

func (m *probeManager) startedLocked(uid types.UID, container, containerID string) bool {
	pod := m.pods[uid]
	if pod == nil {
		if !m.closed {
			m.askedEarly[uid] = true
		}
		return false
	}
	c := probedContainer(pod, container)
	if c == nil || c.StartupProbe == nil {
		return true
	}
	w := m.worker(uid, container, containerID, startupProbe)
	return w != nil && w.result == resultSuccess
}

// ready tells a container's readiness: true when it has no readinessProbe; otherwise false until the probe
// first succeeds, and after failureThreshold failures in a row. Never ready before started.
func (m *probeManager) ready(uid types.UID, container, containerID string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.startedLocked(uid, container, containerID) {
		return false
	}
	c := probedContainer(m.pods[uid], container)
	if c == nil || c.ReadinessProbe == nil {
		return true
	}
	w := m.worker(uid, container, containerID, readinessProbe)
	return w != nil && w.result == resultSuccess
}

// livenessFailed tells whether the container failed its liveness probe (failureThreshold failures in a
// row) or its startup probe; the runtime then kills and restarts it. message is "<Type> probe failed: …".
func (m *probeManager) livenessFailed(uid types.UID, container, containerID string) (failed bool, message string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, kind := range []probeType{startupProbe, livenessProbe} {
		if w := m.worker(uid, container, containerID, kind); w != nil && w.result == resultFailure {
			return true, w.message
		}
	}
	return false, ""
}

// probeWorker probes one probe of one container ID.
type probeWorker struct {
	m           *probeManager
	uid         types.UID
	container   corev1.Container
	fieldPath   string
	kind        probeType
	probe       *corev1.Probe
	containerID string
	startedAt   time.Time
	ctx         context.Context
	cancel      context.CancelFunc
	trigger     chan struct{} // probe now (startup just succeeded)

	// guarded by m.mu
	stopped bool
	result  probeResult
	lastOK  bool
	streak  int // consecutive attempts with result lastOK
	message string
}

func (m *probeManager) newWorker(uid types.UID, c *corev1.Container, kind probeType, p *corev1.Probe, rc runningContainer) *probeWorker {
	ctx, cancel := context.WithCancel(context.Background())
	w := &probeWorker{
		m: m, uid: uid, container: *c, kind: kind, probe: p, containerID: rc.ID, startedAt: rc.StartedAt,
		fieldPath: "spec.containers{" + c.Name + "}",
		ctx:       ctx, cancel: cancel, trigger: make(chan struct{}, 1),
	}
	if pod := m.pods[uid]; pod != nil && !isRegularContainer(pod, c.Name) {
		w.fieldPath = "spec.initContainers{" + c.Name + "}"
	}
	switch kind {
	case livenessProbe:
		w.result = resultSuccess // alive until proven otherwise
	case readinessProbe:
		w.result = resultFailure // not ready until proven otherwise
	}
	return w
}

func isRegularContainer(pod *corev1.Pod, name string) bool {
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			return true
		}
	}
	return false
}

func (w *probeWorker) stopLocked() {
	w.stopped = true
	w.cancel()
}

func (w *probeWorker) run() {
	defer w.m.wg.Done()
	w.m.active.Add(1)
	defer w.m.active.Add(-1)
	defer w.cancel()

	if d := time.Until(w.startedAt.Add(time.Duration(w.probe.InitialDelaySeconds) * time.Second)); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-w.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
	ticker := time.NewTicker(seconds(w.probe.PeriodSeconds, defaultProbePeriod))
	defer ticker.Stop()
	for w.doProbe() {
		select {
		case <-w.ctx.Done():
			return
		case <-ticker.C:
		case <-w.trigger:
		}
	}
}

// doProbe runs one attempt and records its result; false means the worker is done.
func (w *probeWorker) doProbe() bool {
	m := w.m
	m.mu.Lock()
	pod := m.pods[w.uid]
	if w.stopped || pod == nil {
		m.mu.Unlock()
		return false
	}
	if pod.DeletionTimestamp != nil && w.kind != readinessProbe {
		// The pod is shutting down: no more restarts for liveness or startup failures.
		m.mu.Unlock()
		return false
	}
	if w.kind != startupProbe && !m.startedLocked(w.uid, w.container.Name, w.containerID) {
		m.mu.Unlock()
		return true // readiness and liveness wait for the startup probe
	}
	m.mu.Unlock()

	outcome, out := probeOnce(w.ctx, w.kind, w.probe, pod, &w.container, w.containerID, m.ex)

	m.mu.Lock()
	if w.stopped {
		m.mu.Unlock()
		return false
	}
	pod = m.pods[w.uid]
	event := ""
	switch outcome {
	case probeSkipped:
		m.mu.Unlock()
		return true
	case probeErrored:
		m.mu.Unlock()
		w.event(pod, fmt.Sprintf("%s probe errored: %s", w.kind, out))
		return true
	case probeFailed:
		event = fmt.Sprintf("%s probe failed: %s", w.kind, out)
	}
	ok := outcome == probeSucceeded
	if w.streak > 0 && ok == w.lastOK {
		w.streak++
	} else {
		w.lastOK, w.streak = ok, 1
	}
	threshold := int(w.probe.FailureThreshold)
	if threshold <= 0 {
		threshold = defaultProbeFailure
	}
	if ok {
		threshold = 1
		if w.kind == readinessProbe && w.probe.SuccessThreshold > 1 {
			threshold = int(w.probe.SuccessThreshold) // liveness and startup must use 1
		}
	}
	more, changed := true, false
	var siblings []*probeWorker
	if w.streak >= threshold {
		res := resultSuccess
		if !ok {
			res = resultFailure
			w.message = event
		}
		changed = w.result != res
		w.result = res
		switch {
		case !ok && w.kind != readinessProbe:
			more = false // the container will be killed and restarted with a new ID
		case ok && w.kind == startupProbe:
			more = false
			for _, kind := range []probeType{livenessProbe, readinessProbe} {
				if s := m.worker(w.uid, w.container.Name, w.containerID, kind); s != nil {
					siblings = append(siblings, s)
				}
			}
		}
	}
	m.mu.Unlock()

	if event != "" {
		w.event(pod, event)
	}
	for _, s := range siblings {
		select {
		case s.trigger <- struct{}{}:
		default:
		}
	}
	if changed && m.onChange != nil {
		m.onChange(pod)
	}
	return more
}

// event records a Warning Unhealthy event on the pod, pointing at the container as the kubelet does.
func (w *probeWorker) event(pod *corev1.Pod, message string) {
	if w.m.recorder == nil || pod == nil {
		return
	}
	ref := &corev1.ObjectReference{
		Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID,
		ResourceVersion: pod.ResourceVersion, FieldPath: w.fieldPath,
	}
	w.m.recorder.Eventf(ref, corev1.EventTypeWarning, "Unhealthy", "%s", message)
}
