package nodeagent

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/cio"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cri-client/pkg/logs"
	"k8s.io/cri-streaming/pkg/streaming"
	remotecommandserver "k8s.io/cri-streaming/pkg/streaming/remotecommand"
	utilexec "k8s.io/utils/exec"

	"github.com/skiff-dev/skiff/nodeagent/containerio"
	"github.com/skiff-dev/skiff/nodeagent/containerlogs"
)

// labelStdinOnce marks a container whose stdin closes after its first attach (stdinOnce).
const labelStdinOnce = "io.skiff.container.stdin-once"

// podLookup finds the pods bound to the agent's node in its informer's cache.
type podLookup struct{ pods podStore }

func (l podLookup) pod(namespace, name string) (*corev1.Pod, error) {
	obj, ok, err := l.pods.GetByKey(namespace + "/" + name)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, notFound("pod %s/%s is not on this node", namespace, name)
	}
	return obj.(*corev1.Pod), nil
}

// containerStatusFor finds a container's status among the pod's app, init and ephemeral containers.
func containerStatusFor(pod *corev1.Pod, name string) (*corev1.ContainerStatus, bool) {
	for _, list := range [][]corev1.ContainerStatus{pod.Status.ContainerStatuses, pod.Status.InitContainerStatuses, pod.Status.EphemeralContainerStatuses} {
		for i := range list {
			if list[i].Name == name {
				return &list[i], true
			}
		}
	}
	return nil, false
}

// runningContainerID is the containerd ID of a container that runs now; otherwise the kubelet's 400 saying
// why it does not ("is waiting to start: ContainerCreating").
func runningContainerID(pod *corev1.Pod, name string) (string, error) {
	s, ok := containerStatusFor(pod, name)
	switch {
	case !ok:
		return "", badRequest("container %q in pod %q is waiting to start: ContainerCreating", name, pod.Name)
	case s.State.Running != nil:
		return strings.TrimPrefix(s.ContainerID, "containerd://"), nil
	case s.State.Waiting != nil:
		return "", badRequest("container %q in pod %q is waiting to start: %s", name, pod.Name, waitingReason(s.State.Waiting))
	}
	return "", badRequest("container %q in pod %q is not running", name, pod.Name)
}

// latestAttempt reads the newest attempt of a pod's container from containerd, without changing anything:
// the runtime's own view, for when the pod's status (as the agent's informer last saw it) lags behind it.
func (r *containerdRuntime) latestAttempt(ctx context.Context, pod *corev1.Pod, name string) (id string, running bool) {
	cctx := r.ctx(context.WithoutCancel(ctx))
	ctrs, err := r.client.Containers(cctx, fmt.Sprintf("labels.%q==%s,labels.%q==%s", labelPodUID, pod.UID, labelName, name))
	if err != nil {
		return "", false
	}
	best := -1
	for _, c := range ctrs {
		labels, err := c.Labels(cctx)
		if err != nil || labels[labelKind] == kindSandbox {
			continue
		}
		if a, err := strconv.Atoi(labels[labelAttempt]); err == nil && a > best {
			best, id = a, c.ID()
		}
	}
	if id == "" {
		return "", false
	}
	return id, r.taskRunning(ctx, id)
}

// waitingReason words a waiting container's reason as the kubelet does for logs and exec.
func waitingReason(w *corev1.ContainerStateWaiting) string {
	switch w.Reason {
	case "ErrImagePull":
		return "image can't be pulled"
	case "ImagePullBackOff":
		return "trying and failing to pull image"
	case "":
		return "ContainerCreating"
	}
	return w.Reason
}

// logContainer chooses the container instance whose log a request reads, as the kubelet's
// validateContainerLogStatus: the running one, else the last terminated one; with previous, the one before.
func logContainer(pod *corev1.Pod, name string, previous bool) (string, error) {
	s, ok := containerStatusFor(pod, name)
	if !ok {
		return "", badRequest("container %q in pod %q is waiting to start: ContainerCreating", name, pod.Name)
	}
	last := s.LastTerminationState.Terminated
	switch {
	case previous && last != nil && last.ContainerID != "":
		return last.ContainerID, nil
	case previous:
		return "", badRequest("previous terminated container %q in pod %q not found", name, pod.Name)
	case s.State.Running != nil:
		return s.ContainerID, nil
	case s.State.Terminated != nil && s.State.Terminated.ContainerID != "":
		return s.State.Terminated.ContainerID, nil
	case last != nil && last.ContainerID != "":
		return last.ContainerID, nil
	case s.State.Waiting != nil:
		return "", badRequest("container %q in pod %q is waiting to start: %s", name, pod.Name, waitingReason(s.State.Waiting))
	}
	return "", badRequest("container %q in pod %q is terminated", name, pod.Name)
}

// attemptOf reads the attempt number at the end of a container ID (containerID in runtime_containerd.go).
func attemptOf(id string) (int, error) {
	i := strings.LastIndexByte(id, '-')
	if i < 0 {
		return 0, fmt.Errorf("container ID %q has no attempt", id)
	}
	return strconv.Atoi(id[i+1:])
}

// containerLogPath is where a container attempt's CRI log is written.
func (r *containerdRuntime) containerLogPath(pod *corev1.Pod, name string, attempt int) string {
	return filepath.Join(r.podDir(pod), "logs", name, strconv.Itoa(attempt)+".log")
}

// containerIODir holds a container attempt's FIFOs and the process that keeps its stdio (containerio).
func (r *containerdRuntime) containerIODir(pod *corev1.Pod, id string) string {
	return filepath.Join(r.podDir(pod), "io", id)
}

// containerLogs serves /containerLogs/{namespace}/{pod}/{container} with the kubelet's query options.
func (e *endpoint) containerLogs(w http.ResponseWriter, r *http.Request) {
	pod, err := e.pods.pod(r.PathValue("namespace"), r.PathValue("pod"))
	if err != nil {
		writeError(w, err)
		return
	}
	name := r.PathValue("container")
	q := r.URL.Query()
	opts, err := logOptions(q)
	if err != nil {
		writeError(w, err)
		return
	}
	previous, _ := strconv.ParseBool(q.Get("previous"))
	id, err := logContainer(pod, name, previous)
	if err != nil && !previous {
		// As for exec: the status seen here may not show a container that has just started.
		if latest, _ := e.rt.latestAttempt(r.Context(), pod, name); latest != "" {
			id, err = latest, nil
		}
	}
	if err != nil {
		writeError(w, err)
		return
	}
	id = strings.TrimPrefix(id, "containerd://")
	attempt, err := attemptOf(id)
	if err != nil {
		writeError(w, err)
		return
	}
	path := e.rt.containerLogPath(pod, name, attempt)
	if _, err := os.Stat(path); err != nil {
		writeError(w, notFound("the log of container %q in pod %q is gone: %v", name, pod.Name, err))
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	out := &flushWriter{w: w, f: w.(http.Flusher)}
	defer out.close()
	stdout, stderr := io.Writer(out), io.Writer(out)
	switch q.Get("stream") {
	case corev1.LogStreamStdout:
		stderr = io.Discard
	case corev1.LogStreamStderr:
		stdout = io.Discard
	}
	running := func() bool { return e.rt.taskRunning(r.Context(), id) }
	if err := containerlogs.ReadLogs(r.Context(), path, opts, running, stdout, stderr); err != nil && r.Context().Err() == nil {
		e.logger.Debug("reading container logs", "pod", pod.Namespace+"/"+pod.Name, "container", name, "error", err)
	}
}

// logOptions reads the kubelet's log query parameters (the servers have validated them).
func logOptions(q interface{ Get(string) string }) (*logs.LogOptions, error) {
	opts := &logs.LogOptions{}
	opts.Follow, _ = strconv.ParseBool(q.Get("follow"))
	opts.Timestamp, _ = strconv.ParseBool(q.Get("timestamps"))
	for _, n := range []struct {
		key string
		to  **int64
	}{{"tailLines", &opts.TailLines}, {"limitBytes", &opts.LimitBytes}} {
		if v := q.Get(n.key); v != "" {
			i, err := strconv.ParseInt(v, 10, 64)
			if err != nil || i < 0 {
				return nil, badRequest("%s: %q is not a non-negative integer", n.key, v)
			}
			*n.to = &i
		}
	}
	if v := q.Get("sinceSeconds"); v != "" {
		s, err := strconv.ParseInt(v, 10, 64)
		if err != nil || s < 1 {
			return nil, badRequest("sinceSeconds: %q is not a positive integer", v)
		}
		opts.Since = time.Now().Add(-time.Duration(s) * time.Second)
	}
	if v := q.Get("sinceTime"); v != "" {
		t, err := time.Parse(time.RFC3339, v)
		if err != nil {
			return nil, badRequest("sinceTime: %q is not an RFC 3339 time", v)
		}
		opts.Since = t
	}
	return opts, nil
}

// flushDelay is how long a followed log's output may wait in the response buffer: long enough that a fast
// writer's lines leave in large chunks, not one TLS record (and one flush up the servers' proxy) per line.
const flushDelay = 10 * time.Millisecond

// flushWriter flushes what was written within flushDelay, so that a followed log reaches the client at once
// when it is quiet, and in buffer-sized chunks when it is busy.
type flushWriter struct {
	mu      sync.Mutex
	w       io.Writer
	f       http.Flusher
	pending bool
	closed  bool
}

func (f *flushWriter) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, err := f.w.Write(p)
	if !f.pending {
		f.pending = true
		time.AfterFunc(flushDelay, f.flush)
	}
	return n, err
}

func (f *flushWriter) flush() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.closed {
		f.f.Flush()
	}
	f.pending = false
}

// close flushes what is left and stops later timers from touching the finished response.
func (f *flushWriter) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.closed {
		f.f.Flush()
	}
	f.closed = true
}

// taskRunning tells whether a container's process runs.
func (r *containerdRuntime) taskRunning(ctx context.Context, id string) bool {
	ctx = r.ctx(context.WithoutCancel(ctx))
	ctr, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return false
	}
	task, err := ctr.Task(ctx, nil)
	if err != nil {
		return false
	}
	st, err := task.Status(ctx)
	return err == nil && st.Status == containerd.Running
}

// streamRuntime is the runtime the CRI streaming server serves exec, attach and port-forward with, on
// containerd: exec processes in the container, the container's own stdio (its log and its stdin FIFO), and
// connections dialed in the pod's network namespace.
type streamRuntime struct{ r *containerdRuntime }

// Exec runs cmd in the container until it exits, or until ctx ends (the client went away) and it is killed.
// A non-zero exit is a utilexec.ExitError, which the streaming server reports as the exit code.
func (s streamRuntime) Exec(ctx context.Context, containerID string, cmd []string, in io.Reader, out, errw io.WriteCloser, tty bool, resize <-chan remotecommandserver.TerminalSize) error {
	r := s.r
	cctx := r.ctx(context.WithoutCancel(ctx))
	ctr, err := r.client.LoadContainer(cctx, containerID)
	if err != nil {
		return err
	}
	task, err := ctr.Task(cctx, nil)
	if err != nil {
		return err
	}
	spec, err := ctr.Spec(cctx)
	if err != nil {
		return err
	}
	proc := *spec.Process
	proc.Args, proc.Terminal = cmd, tty
	fifoDir := filepath.Join(r.cfg.DataDir, "fifo")
	if err := os.MkdirAll(fifoDir, 0o700); err != nil {
		return err
	}
	// containerd closes a process's stdin only when asked (CloseIO), not when its FIFO ends: the client's EOF
	// (`echo x | kubectl exec -i ... cat`) must be passed on, once the process has started.
	started := make(chan containerd.Process, 1)
	if in != nil {
		in = &eofHook{r: in, onEOF: func() {
			if p, ok := <-started; ok {
				started <- p
				_ = p.CloseIO(cctx, containerd.WithStdinCloser)
			}
		}}
	}
	opts := []cio.Opt{cio.WithStreams(in, writerOrNil(out), writerOrNil(errw)), cio.WithFIFODir(fifoDir)}
	if tty {
		opts = append(opts, cio.WithTerminal)
	}
	execID := fmt.Sprintf("exec-%016x", rand.Uint64())
	p, err := task.Exec(cctx, execID, &proc, cio.NewCreator(opts...))
	if err != nil {
		close(started)
		return err
	}
	defer func() { _, _ = p.Delete(cctx, containerd.WithProcessKill) }()
	exited, err := p.Wait(cctx)
	if err != nil {
		close(started)
		return err
	}
	if err := p.Start(cctx); err != nil {
		close(started)
		return err
	}
	started <- p
	go forwardResize(ctx, resize, func(w, h uint32) error { return p.Resize(cctx, w, h) })
	select {
	case st := <-exited:
		drainIO(p.IO())
		if code := st.ExitCode(); code != 0 {
			return utilexec.CodeExitError{Err: fmt.Errorf("command terminated with exit code %d", code), Code: int(code)}
		}
		return nil
	case <-ctx.Done():
		_ = p.Kill(cctx, syscall.SIGKILL)
		<-exited
		p.IO().Cancel()
		return ctx.Err()
	}
}

// writerOrNil keeps a nil stream nil: cio opens no FIFO for it.
func writerOrNil(w io.WriteCloser) io.Writer {
	if w == nil {
		return nil
	}
	return w
}

// drainIO waits for the output to be copied, but not for ever: a background child can hold it open.
func drainIO(pio cio.IO) {
	drained := make(chan struct{})
	go func() { pio.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(2 * time.Second):
		pio.Cancel()
	}
	pio.Close()
}

func forwardResize(ctx context.Context, resize <-chan remotecommandserver.TerminalSize, apply func(w, h uint32) error) {
	if resize == nil {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case size, ok := <-resize:
			if !ok {
				return
			}
			if size.Width > 0 && size.Height > 0 {
				_ = apply(uint32(size.Width), uint32(size.Height))
			}
		}
	}
}

// Attach joins the container's own stdio: its output from now on, read from its log as it is written, and
// its stdin FIFO, which the container's stdio process keeps open. With stdinOnce, the container's stdin
// closes when this first attach ends.
func (s streamRuntime) Attach(ctx context.Context, containerID string, in io.Reader, out, errw io.WriteCloser, tty bool, resize <-chan remotecommandserver.TerminalSize) error {
	r := s.r
	cctx := r.ctx(context.WithoutCancel(ctx))
	ctr, err := r.client.LoadContainer(cctx, containerID)
	if err != nil {
		return err
	}
	labels, err := ctr.Labels(cctx)
	if err != nil {
		return err
	}
	pod := &corev1.Pod{}
	pod.UID, pod.Name, pod.Namespace = types.UID(labels[labelPodUID]), labels[labelPodName], labels[labelPodNamespace]
	attempt, _ := strconv.Atoi(labels[labelAttempt])
	logPath := r.containerLogPath(pod, labels[labelName], attempt)
	ioDir := r.containerIODir(pod, containerID)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if task, err := ctr.Task(cctx, nil); err == nil {
		go forwardResize(ctx, resize, func(w, h uint32) error { return task.Resize(cctx, w, h) })
	}
	if in != nil {
		stdin, err := containerio.OpenStdin(ioDir)
		if err != nil {
			return fmt.Errorf("the container was not started with stdin: true: %w", err)
		}
		go func() {
			_, _ = io.Copy(stdin, in)
			stdin.Close()
			if labels[labelStdinOnce] == "true" {
				// The first attach is over: the container's stdin ends (containerd closes it only when asked).
				_ = containerio.CloseStdin(ioDir)
				if task, err := ctr.Task(cctx, nil); err == nil {
					_ = task.CloseIO(cctx, containerd.WithStdinCloser)
				}
			}
		}()
	}
	if out == nil {
		out = nopWriteCloser{io.Discard}
	}
	var stderr io.Writer = io.Discard
	if errw != nil {
		stderr = errw
	}
	zero := int64(0)
	running := func() bool { return r.taskRunning(ctx, containerID) }
	err = containerlogs.ReadLogs(ctx, logPath, &logs.LogOptions{TailLines: &zero, Follow: true}, running, out, stderr)
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// eofHook calls onEOF once when its reader ends.
type eofHook struct {
	r     io.Reader
	onEOF func()
	once  sync.Once
}

func (h *eofHook) Read(p []byte) (int, error) {
	n, err := h.r.Read(p)
	if err != nil {
		h.once.Do(h.onEOF)
	}
	return n, err
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

// PortForward connects a stream to a port of the pod, dialed on localhost in the pod's network namespace
// (the host's, for a hostNetwork pod), as the kubelet does.
func (s streamRuntime) PortForward(ctx context.Context, podSandboxID string, port int32, stream io.ReadWriteCloser) error {
	r := s.r
	defer stream.Close()
	cctx := r.ctx(context.WithoutCancel(ctx))
	sb, err := r.client.LoadContainer(cctx, podSandboxID+"-sandbox")
	if err != nil {
		return fmt.Errorf("pod sandbox %s: %w", podSandboxID, err)
	}
	labels, err := sb.Labels(cctx)
	if err != nil {
		return err
	}
	conn, err := dialInNetns(ctx, labels[labelNetns], net.JoinHostPort("127.0.0.1", strconv.Itoa(int(port))))
	if err != nil {
		return fmt.Errorf("failed to connect to localhost:%d inside namespace %q: %w", port, podSandboxID, err)
	}
	defer conn.Close()
	// The client's end of its data is passed on as a half-close; the stream is over when the pod's side has
	// said all it will (a request sent and closed still gets its whole answer), or the client went away.
	go func() {
		_, _ = io.Copy(conn, stream)
		if tc, ok := conn.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
	}()
	done := make(chan struct{})
	go func() {
		_, _ = io.Copy(stream, conn)
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
	return nil
}

// dialInNetns dials addr from inside a network namespace; the socket stays in it after the thread leaves.
func dialInNetns(ctx context.Context, netnsPath, addr string) (net.Conn, error) {
	dialer := &net.Dialer{Timeout: 10 * time.Second}
	if netnsPath == "" {
		return dialer.DialContext(ctx, "tcp", addr)
	}
	type result struct {
		conn net.Conn
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		// The thread is left locked and dies with the goroutine if it cannot go back to the host namespace.
		goruntime.LockOSThread()
		host, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer host.Close()
		target, err := os.Open(netnsPath)
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{err: fmt.Errorf("entering %s: %w", netnsPath, err)}
			return
		}
		conn, err := dialer.DialContext(ctx, "tcp", addr)
		ch <- result{conn, err}
		if unix.Setns(int(host.Fd()), unix.CLONE_NEWNET) == nil {
			goruntime.UnlockOSThread()
		}
	}()
	res := <-ch
	return res.conn, res.err
}

// newStreamingServer is the CRI streaming server the endpoint serves exec, attach and port-forward through.
func newStreamingServer(r *containerdRuntime) (streaming.Server, error) {
	cfg := streaming.DefaultConfig
	// Never listened on: the endpoint serves its requests in-process, by the path of the URL it hands out.
	cfg.BaseURL = &url.URL{Scheme: "https", Host: "agent"}
	return streaming.NewServer(cfg, streamRuntime{r})
}
