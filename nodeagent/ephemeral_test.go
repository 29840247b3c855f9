package nodeagent

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/errdefs"
	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/internal/testimages"
	"github.com/skiff-dev/skiff/nodeagent/containerio"
)

// TestMain lets containerio.Start spawn the test binary itself as a container's stdio process, as the agent
// spawns the skiff binary; without it the child would run this package's tests.
func TestMain(m *testing.M) {
	containerio.RunChildIfAsked()
	os.Exit(m.Run())
}

func TestEphemeralContainerConversion(t *testing.T) {
	root := int64(0)
	ec := &corev1.EphemeralContainer{TargetContainerName: "app", EphemeralContainerCommon: corev1.EphemeralContainerCommon{
		Name: "debugger", Image: "busybox", Command: []string{"sh"}, Args: []string{"-c", "ps"}, WorkingDir: "/tmp",
		Env:             []corev1.EnvVar{{Name: "A", Value: "1"}},
		EnvFrom:         []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cm"}}}},
		VolumeMounts:    []corev1.VolumeMount{{Name: "data", MountPath: "/data", ReadOnly: true}},
		ImagePullPolicy: corev1.PullIfNotPresent, SecurityContext: &corev1.SecurityContext{RunAsUser: &root},
		Stdin: true, StdinOnce: true, TTY: true, TerminationMessagePath: "/dev/termination-log",
		// Forbidden by the API for ephemeral containers; dropped should a server let them through.
		Ports:         []corev1.ContainerPort{{ContainerPort: 80}},
		LivenessProbe: &corev1.Probe{}, ReadinessProbe: &corev1.Probe{}, StartupProbe: &corev1.Probe{},
		Lifecycle:     &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Sleep: &corev1.SleepAction{Seconds: 1}}},
		Resources:     corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}},
		RestartPolicy: ptr(corev1.ContainerRestartPolicyAlways),
	}}
	c := ephemeralContainer(ec)
	want := corev1.Container{
		Name: "debugger", Image: "busybox", Command: []string{"sh"}, Args: []string{"-c", "ps"}, WorkingDir: "/tmp",
		Env: ec.Env, EnvFrom: ec.EnvFrom, VolumeMounts: ec.VolumeMounts,
		ImagePullPolicy: corev1.PullIfNotPresent, SecurityContext: ec.SecurityContext,
		Stdin: true, StdinOnce: true, TTY: true, TerminationMessagePath: "/dev/termination-log",
	}
	if !reflect.DeepEqual(*c, want) {
		t.Errorf("converted\n%+v\nwant\n%+v", *c, want)
	}
	if ec.LivenessProbe == nil || len(ec.Ports) != 1 || ec.RestartPolicy == nil {
		t.Error("the conversion changed the pod's spec")
	}
	if isSidecar(c) {
		t.Error("an ephemeral container must never count as a sidecar")
	}
}

func TestEphemeralNeedsStart(t *testing.T) {
	tests := []struct {
		name string
		last *ctrRecord
		want bool
	}{
		{"never created", nil, true},
		{"created, never started", &ctrRecord{}, true},
		{"running", &ctrRecord{running: true}, false},
		{"exited 0", &ctrRecord{exited: true}, false},
		{"exited 1", &ctrRecord{exited: true, exitCode: 1}, false},
		{"failed to start", &ctrRecord{exited: true, exitCode: 128, reason: "StartError"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ephemeralNeedsStart(tt.last); got != tt.want {
				t.Errorf("ephemeralNeedsStart = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestTargetPID(t *testing.T) {
	recs := &podRecords{attempts: map[string][]*ctrRecord{
		kindApp + "/app":         {{kind: kindApp, name: "app", exited: true}, {kind: kindApp, name: "app", attempt: 1, running: true, pid: 42}},
		kindApp + "/stopped":     {{kind: kindApp, name: "stopped", exited: true, pid: 7}},
		kindInit + "/sidecar":    {{kind: kindInit, name: "sidecar", running: true, pid: 43}},
		kindEphemeral + "/debug": {{kind: kindEphemeral, name: "debug", running: true, pid: 44}},
	}}
	tests := []struct {
		name string
		pid  uint32
		ok   bool
	}{
		{"app", 42, true},
		{"sidecar", 43, true},
		{"stopped", 0, false},
		{"debug", 0, false}, // an ephemeral container is no target
		{"missing", 0, false},
	}
	for _, tt := range tests {
		if pid, ok := targetPID(recs, tt.name); pid != tt.pid || ok != tt.ok {
			t.Errorf("targetPID(%s) = %d, %v; want %d, %v", tt.name, pid, ok, tt.pid, tt.ok)
		}
	}
}

// TestEphemeralStatus checks the statuses the containerd runtime reports from its records: an ephemeral
// container that exited is terminated (never CrashLoopBackOff, whatever the restartPolicy), never ready, with
// restart count 0; and it changes neither the pod's phase nor its readiness.
func TestEphemeralStatus(t *testing.T) {
	started := time.Unix(1000, 0)
	finished := time.Unix(1010, 0)
	for _, policy := range []corev1.RestartPolicy{corev1.RestartPolicyAlways, corev1.RestartPolicyOnFailure, corev1.RestartPolicyNever} {
		t.Run(string(policy), func(t *testing.T) {
			r := &containerdRuntime{cfg: &config.Agent{DataDir: t.TempDir()}, waiting: map[types.UID]map[string]corev1.ContainerStateWaiting{}, resync: func(*corev1.Pod, time.Duration) {}}
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "u1", Name: "p", Namespace: "default"}, Spec: corev1.PodSpec{
				RestartPolicy: policy,
				Containers:    []corev1.Container{{Name: "app", Image: "web:1"}},
				EphemeralContainers: []corev1.EphemeralContainer{
					{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "failed", Image: "busybox"}, TargetContainerName: "app"},
					{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "running", Image: "busybox"}},
					{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "pending", Image: "busybox"}, TargetContainerName: "gone"},
				},
			}}
			labels := map[string]string{labelImageID: "busybox@sha256:abc"}
			recs := &podRecords{attempts: map[string][]*ctrRecord{
				kindApp + "/app": {{kind: kindApp, name: "app", id: "u1-app-app-0", labels: labels, running: true, pid: 42, startedAt: started}},
				kindEphemeral + "/failed": {{kind: kindEphemeral, name: "failed", id: "u1-ephemeral-failed-0", labels: labels, exited: true,
					exitCode: 3, reason: "Error", startedAt: started, finishedAt: finished}},
				kindEphemeral + "/running": {{kind: kindEphemeral, name: "running", id: "u1-ephemeral-running-0", labels: labels, running: true,
					pid: 44, startedAt: started}},
			}}
			// The sync starts nothing (the client is nil: a start would panic), and the one whose target does
			// not run waits.
			if err := r.syncEphemeralContainers(context.Background(), pod, recs, &sandbox{pid: 1}, nil); err != nil {
				t.Fatal(err)
			}
			state := r.state(pod, recs, &sandbox{pid: 1, ip: "10.42.0.5"})
			if len(state.EphemeralContainers) != 3 {
				t.Fatalf("ephemeral statuses %+v", state.EphemeralContainers)
			}
			failed, running, pending := state.EphemeralContainers[0], state.EphemeralContainers[1], state.EphemeralContainers[2]
			wantFailed := corev1.ContainerStatus{Name: "failed", Image: "busybox", ImageID: "busybox@sha256:abc", Resources: &corev1.ResourceRequirements{},
				ContainerID: "containerd://u1-ephemeral-failed-0", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
					ExitCode: 3, Reason: "Error", StartedAt: metav1.NewTime(started), FinishedAt: metav1.NewTime(finished),
					ContainerID: "containerd://u1-ephemeral-failed-0"}}}
			if !reflect.DeepEqual(failed, wantFailed) {
				t.Errorf("failed ephemeral container\n%+v\nwant\n%+v", failed, wantFailed)
			}
			if running.State.Running == nil || running.Ready || running.Started != nil || running.RestartCount != 0 ||
				running.ContainerID != "containerd://u1-ephemeral-running-0" || running.ImageID != "busybox@sha256:abc" {
				t.Errorf("running ephemeral container %+v", running)
			}
			if w := pending.State.Waiting; w == nil || w.Reason != "CreateContainerConfigError" || w.Message != "unable to find target container gone" ||
				pending.ContainerID != "" {
				t.Errorf("ephemeral container with a missing target %+v", pending)
			}

			status := podStatus(pod, state, "192.168.1.10")
			if !reflect.DeepEqual(status.EphemeralContainerStatuses, state.EphemeralContainers) {
				t.Errorf("pod status ephemeral containers %+v", status.EphemeralContainerStatuses)
			}
			if status.Phase != corev1.PodRunning {
				t.Errorf("phase %s", status.Phase)
			}
		})
	}
}

// TestPodStatusIgnoresEphemeral: ephemeral containers count for neither the phase nor readiness.
func TestPodStatusIgnoresEphemeral(t *testing.T) {
	ready := csRunning()
	ready.Ready = true
	tests := []struct {
		name      string
		policy    corev1.RestartPolicy
		ctrs      []corev1.ContainerStatus
		ephemeral []corev1.ContainerStatus
		phase     corev1.PodPhase
		ready     corev1.ConditionStatus
	}{
		{"running app, waiting ephemeral", corev1.RestartPolicyAlways, []corev1.ContainerStatus{ready}, []corev1.ContainerStatus{csWaiting()},
			corev1.PodRunning, corev1.ConditionTrue},
		{"running app, failed ephemeral", corev1.RestartPolicyNever, []corev1.ContainerStatus{ready}, []corev1.ContainerStatus{csExited(1)},
			corev1.PodRunning, corev1.ConditionTrue},
		{"app done, ephemeral running", corev1.RestartPolicyNever, []corev1.ContainerStatus{csExited(0)}, []corev1.ContainerStatus{csRunning()},
			corev1.PodSucceeded, corev1.ConditionFalse},
		{"app failed, ephemeral done", corev1.RestartPolicyNever, []corev1.ContainerStatus{csExited(2)}, []corev1.ContainerStatus{csExited(0)},
			corev1.PodFailed, corev1.ConditionFalse},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := &corev1.Pod{Spec: corev1.PodSpec{RestartPolicy: tt.policy}}
			state := &PodState{SandboxReady: true, Started: time.Unix(1000, 0), Containers: tt.ctrs, EphemeralContainers: tt.ephemeral}
			st := podStatus(pod, state, "192.168.1.10")
			if st.Phase != tt.phase {
				t.Errorf("phase %s, want %s", st.Phase, tt.phase)
			}
			for _, c := range st.Conditions {
				if (c.Type == corev1.PodReady || c.Type == corev1.ContainersReady) && c.Status != tt.ready {
					t.Errorf("condition %s = %s, want %s", c.Type, c.Status, tt.ready)
				}
			}
			if !reflect.DeepEqual(st.EphemeralContainerStatuses, tt.ephemeral) {
				t.Errorf("ephemeral statuses %+v", st.EphemeralContainerStatuses)
			}
		})
	}
}

// TestRealEphemeralContainer runs `kubectl debug --target=app` for real, on a private containerd with runc:
// an ephemeral container added to a running pod starts with the pod's volume, sees the target's processes
// (it shares the target's PID namespace), is reported as the kubelet reports it, and is not restarted after
// it exits, although the pod's restartPolicy is Always. A host-network pod keeps CNI out of the test.
func TestRealEphemeralContainer(t *testing.T) {
	if testing.Short() {
		t.Skip("starts containerd")
	}
	if os.Geteuid() != 0 {
		t.Skip("real containers need root")
	}
	for _, bin := range []string{"containerd", "runc"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Skipf("%s not installed", bin)
		}
	}
	refs := testimages.Push(t, testimages.StartRegistry(t))

	// A short data dir: containerd's socket path must fit in 107 bytes.
	dir, err := os.MkdirTemp("", "skiff-eph-")
	if err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	logger := hclog.New(&hclog.LoggerOptions{Output: logs, Level: hclog.Debug})
	cfg := &config.Agent{Name: fmt.Sprintf("eph-%04x", rand.IntN(1<<16)), DataDir: dir + "/data", AdvertiseAddr: "127.0.0.1", PauseImage: refs.Pause}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	daemonCtx, stopDaemon := context.WithCancel(context.Background())
	r, err := newContainerdRuntime(daemonCtx, cfg, logger)
	if err != nil {
		stopDaemon()
		cancel()
		_ = Teardown(context.Background(), cfg, logger)
		os.RemoveAll(dir)
		t.Fatal(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "debug-me", Namespace: "default", UID: types.UID(fmt.Sprintf("eph%08x", rand.Uint32()))},
		Spec: corev1.PodSpec{
			HostNetwork: true, RestartPolicy: corev1.RestartPolicyAlways, TerminationGracePeriodSeconds: ptr(int64(0)),
			Volumes: []corev1.Volume{{Name: "shared", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
			Containers: []corev1.Container{{Name: "app", Image: refs.Busybox, ImagePullPolicy: corev1.PullIfNotPresent,
				Command:      []string{"sh", "-c", "echo from-app > /shared/x && exec sleep 3600"},
				VolumeMounts: []corev1.VolumeMount{{Name: "shared", MountPath: "/shared"}}}},
		},
	}
	t.Cleanup(func() {
		// The pod, then the daemon, then whatever a failure left on the host.
		kctx, kcancel := context.WithTimeout(context.Background(), time.Minute)
		if err := r.KillPod(kctx, pod, func() time.Duration { return 0 }); err != nil {
			t.Errorf("KillPod: %v", err)
		}
		kcancel()
		cancel()
		r.Close()
		stopDaemon()
		r.daemon.stop()
		tctx, tcancel := context.WithTimeout(context.Background(), 2*time.Minute)
		if err := Teardown(tctx, cfg, hclog.NewNullLogger()); err != nil {
			t.Errorf("teardown: %v", err)
		}
		tcancel()
		if t.Failed() {
			t.Logf("runtime log:\n%s", logs.String())
		}
		os.RemoveAll(dir)
	})
	r.attach(noObjects{}, testRecorder{logger}, func(*corev1.Pod, time.Duration) {}, &corev1.Node{})

	// syncUntil syncs the pod (as the agent's pod worker does on every event) until cond holds.
	syncUntil := func(what string, cond func(*PodState) bool) *PodState {
		t.Helper()
		var state *PodState
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			var err error
			if state, err = r.SyncPod(ctx, pod); err != nil {
				t.Logf("sync: %v", err)
			}
			if state != nil && cond(state) {
				return state
			}
		}
		t.Fatalf("%s: timed out; last state %+v", what, state)
		return nil
	}
	byName := func(statuses []corev1.ContainerStatus, name string) corev1.ContainerStatus {
		for _, s := range statuses {
			if s.Name == name {
				return s
			}
		}
		return corev1.ContainerStatus{}
	}
	syncUntil("app running", func(s *PodState) bool { return len(s.Containers) == 1 && s.Containers[0].State.Running != nil })

	// kubectl debug: the ephemeral containers subresource adds them to the spec.
	pod.Spec.EphemeralContainers = []corev1.EphemeralContainer{
		{TargetContainerName: "app", EphemeralContainerCommon: corev1.EphemeralContainerCommon{
			Name: "debugger", Image: refs.Busybox, ImagePullPolicy: corev1.PullIfNotPresent,
			Command:      []string{"sh", "-c", "until [ -e /shared/stop ]; do sleep 0.1; done; exit 3"},
			VolumeMounts: []corev1.VolumeMount{{Name: "shared", MountPath: "/shared"}}}},
		{TargetContainerName: "missing", EphemeralContainerCommon: corev1.EphemeralContainerCommon{
			Name: "orphan", Image: refs.Busybox, ImagePullPolicy: corev1.PullIfNotPresent, Command: []string{"true"}}},
	}
	state := syncUntil("debugger running", func(s *PodState) bool {
		return len(s.EphemeralContainers) == 2 && s.EphemeralContainers[0].State.Running != nil
	})
	dbg := byName(state.EphemeralContainers, "debugger")
	dbgID := containerID(pod, kindEphemeral, "debugger", 0)
	if dbg.ContainerID != "containerd://"+dbgID || dbg.RestartCount != 0 || dbg.Image != refs.Busybox ||
		!strings.Contains(dbg.ImageID, "@sha256:") || dbg.Ready || dbg.Started != nil {
		t.Errorf("debugger status %+v", dbg)
	}
	if w := byName(state.EphemeralContainers, "orphan").State.Waiting; w == nil || w.Reason != "CreateContainerConfigError" {
		t.Errorf("orphan status %+v", byName(state.EphemeralContainers, "orphan"))
	}
	if st := podStatus(pod, state, cfg.AdvertiseAddr); st.Phase != corev1.PodRunning || len(st.EphemeralContainerStatuses) != 2 {
		t.Errorf("pod status %+v", st)
	}

	// The debugger is in the app's PID namespace: the same namespace on the host, and ps shows the app's sleep.
	recs, err := r.loadPod(r.ctx(ctx), pod.UID, true)
	if err != nil {
		t.Fatal(err)
	}
	app, debugger := recs.latest(kindApp, "app"), recs.latest(kindEphemeral, "debugger")
	if app == nil || debugger == nil || !app.running || !debugger.running {
		t.Fatalf("records: app %+v, debugger %+v", app, debugger)
	}
	appNS, err1 := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", app.pid))
	dbgNS, err2 := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", debugger.pid))
	hostNS, _ := os.Readlink("/proc/self/ns/pid")
	if err1 != nil || err2 != nil || appNS != dbgNS || appNS == hostNS {
		t.Errorf("PID namespaces: app %s (%v), debugger %s (%v), host %s", appNS, err1, dbgNS, err2, hostNS)
	}
	code, out, err := r.Exec(ctx, dbgID, []string{"ps", "-o", "pid,args"})
	if err != nil || code != 0 || !strings.Contains(string(out), "sleep 3600") {
		t.Errorf("ps in the debugger: %d %v\n%s", code, err, out)
	}
	// It mounts the pod's volume by name.
	if code, out, err := r.Exec(ctx, dbgID, []string{"cat", "/shared/x"}); err != nil || code != 0 || string(out) != "from-app\n" {
		t.Errorf("cat /shared/x in the debugger: %d %v %q", code, err, out)
	}

	// It exits with 3 and stays exited: restartPolicy Always does not apply to it.
	if code, out, err := r.Exec(ctx, containerID(pod, kindApp, "app", 0), []string{"touch", "/shared/stop"}); err != nil || code != 0 {
		t.Fatalf("touch /shared/stop: %d %v %s", code, err, out)
	}
	syncUntil("debugger exited", func(s *PodState) bool {
		term := byName(s.EphemeralContainers, "debugger").State.Terminated
		return term != nil && term.ExitCode == 3
	})
	for i := range 3 {
		state, err := r.SyncPod(ctx, pod)
		if state == nil {
			t.Fatalf("sync %d: %v", i, err)
		} else if err != nil {
			t.Logf("sync: %v", err)
		}
		dbg := byName(state.EphemeralContainers, "debugger")
		if term := dbg.State.Terminated; term == nil || term.ExitCode != 3 || term.Reason != "Error" || dbg.RestartCount != 0 {
			t.Errorf("sync %d: debugger %+v", i, dbg)
		}
		if st := podStatus(pod, state, cfg.AdvertiseAddr); st.Phase != corev1.PodRunning {
			t.Errorf("sync %d: phase %s", i, st.Phase)
		}
		if state.Containers[0].State.Running == nil || state.Containers[0].RestartCount != 0 {
			t.Errorf("sync %d: app %+v", i, state.Containers[0])
		}
	}
	if _, err := r.client.LoadContainer(r.ctx(ctx), containerID(pod, kindEphemeral, "debugger", 1)); !errdefs.IsNotFound(err) {
		t.Errorf("a second attempt of the debugger exists (%v)", err)
	}

	// It goes with the pod.
	if err := r.KillPod(ctx, pod, func() time.Duration { return 0 }); err != nil {
		t.Fatal(err)
	}
	ctrs, err := r.client.Containers(r.ctx(ctx), fmt.Sprintf("labels.%q==%s", labelPodUID, pod.UID))
	if err != nil || len(ctrs) != 0 {
		t.Errorf("after KillPod: %d containers (%v)", len(ctrs), err)
	}
}

// noObjects is an API without ConfigMaps or Secrets.
type noObjects struct{}

func (noObjects) ConfigMap(_ context.Context, _, name string) (*corev1.ConfigMap, error) {
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "configmaps"}, name)
}

func (noObjects) RuntimeClass(_ context.Context, name string) (*nodev1.RuntimeClass, error) {
	return nil, apierrors.NewNotFound(nodev1.Resource("runtimeclasses"), name)
}

func (noObjects) Secret(_ context.Context, _, name string) (*corev1.Secret, error) {
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, name)
}

// testRecorder logs events.
type testRecorder struct{ logger hclog.Logger }

func (r testRecorder) Event(_ runtime.Object, kind, reason, message string) {
	r.logger.Info("event", "type", kind, "reason", reason, "message", message)
}

func (r testRecorder) Eventf(obj runtime.Object, kind, reason, format string, args ...any) {
	r.Event(obj, kind, reason, fmt.Sprintf(format, args...))
}

func (r testRecorder) AnnotatedEventf(obj runtime.Object, _ map[string]string, kind, reason, format string, args ...any) {
	r.Eventf(obj, kind, reason, format, args...)
}

// lockedBuffer is a log that goroutines write while the test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
