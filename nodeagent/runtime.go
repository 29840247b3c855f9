package nodeagent

import (
	"context"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Runtime makes pods real on a node.
type Runtime interface {
	// Version is the runtime's name and version for the Node's nodeInfo, such as "containerd://1.6.20".
	Version() string
	// SyncPod brings a pod's sandbox and containers to what its spec asks and returns their state.
	SyncPod(ctx context.Context, pod *corev1.Pod) (*PodState, error)
	// KillPod stops a pod's containers within the grace period and removes them, the sandbox and the volumes.
	// grace is asked again while waiting, because the API may shorten it.
	KillPod(ctx context.Context, pod *corev1.Pod, grace func() time.Duration) error
	// Cleanup removes what runs of pods that keep does not know: pods deleted while the agent was down.
	Cleanup(ctx context.Context, keep func(uid types.UID) bool) error
}

// PodState is what a runtime reports of a pod.
type PodState struct {
	IP      string
	Started time.Time
	// SandboxReady is whether the pod's sandbox and network are up.
	SandboxReady bool
	Containers   []corev1.ContainerStatus
	// InitContainers are the init containers' statuses, in order.
	InitContainers []corev1.ContainerStatus
	// EphemeralContainers are the ephemeral containers' statuses, in spec order. They count for neither the
	// pod's phase nor its readiness.
	EphemeralContainers []corev1.ContainerStatus
	// FailReason, when set, fails the pod whatever its containers say, with FailMessage: the agent ended it
	// (its active deadline passed).
	FailReason, FailMessage string
	// Resize, when set, is a resize of the pod's containers that the node has not admitted or not applied.
	Resize *ResizeState
	// Killed: the agent killed the pod's containers for its deletion; the phase is terminal, Failed unless
	// every container succeeded.
	Killed bool
}

// simulatedRuntime runs no containers: every container starts at once and stays running and ready. It goes
// through the same pod workers and status path as a real runtime, for scale tests and benchmarks; it is
// never used where the real runtime is under test.
type simulatedRuntime struct {
	mu   sync.Mutex
	pods map[types.UID]simulatedPod
	now  func() time.Time
	// ipam hands out pod IPs from each node's pod CIDR, as the host-local IPAM plugin would.
	ipam map[string]*ipPool
}

type simulatedPod struct {
	started time.Time
	node    string
	ip      string
}

func newSimulatedRuntime() *simulatedRuntime {
	return &simulatedRuntime{pods: map[types.UID]simulatedPod{}, now: time.Now, ipam: map[string]*ipPool{}}
}

// setPodCIDR gives a node's pods their addresses; a node without a pod CIDR runs pods without IPs.
func (r *simulatedRuntime) setPodCIDR(node, cidr string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if pool, err := newIPPool(cidr); err == nil {
		r.ipam[node] = pool
	}
}

func (r *simulatedRuntime) Version() string { return "simulated://1" }

func (r *simulatedRuntime) SyncPod(_ context.Context, pod *corev1.Pod) (*PodState, error) {
	r.mu.Lock()
	p, ok := r.pods[pod.UID]
	if !ok {
		p = simulatedPod{started: r.now().Truncate(time.Second), node: pod.Spec.NodeName}
		if pool := r.ipam[p.node]; pool != nil {
			p.ip = pool.allocate(pod.UID)
		}
		r.pods[pod.UID] = p
	}
	r.mu.Unlock()
	started := p.started
	state := &PodState{Started: started, IP: p.ip, SandboxReady: true}
	for _, c := range pod.Spec.InitContainers {
		state.InitContainers = append(state.InitContainers, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: "simulated://" + c.Image, Ready: true,
			ContainerID: "simulated://" + string(pod.UID) + "/" + c.Name,
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: 0, Reason: "Completed", StartedAt: metav1.NewTime(started), FinishedAt: metav1.NewTime(started)}},
		})
	}
	exitCode, exits := simulatedExitCode(pod)
	for _, c := range pod.Spec.Containers {
		running := true
		status := corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: "simulated://" + c.Image, Ready: true, Started: &running,
			ContainerID: "simulated://" + string(pod.UID) + "/" + c.Name,
			State:       corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(started)}},
		}
		if exits {
			running = false
			reason := "Completed"
			if exitCode != 0 {
				reason = "Error"
			}
			status.Ready, status.State = false, corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: exitCode, Reason: reason, StartedAt: metav1.NewTime(started), FinishedAt: metav1.NewTime(started)}}
		}
		state.Containers = append(state.Containers, status)
	}
	// Ephemeral containers run from the sync that sees them; like the kubelet's, they are never ready.
	for _, c := range pod.Spec.EphemeralContainers {
		state.EphemeralContainers = append(state.EphemeralContainers, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: "simulated://" + c.Image,
			ContainerID: "simulated://" + string(pod.UID) + "/" + c.Name,
			State:       corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(started)}},
		})
	}
	return state, nil
}

// SimulatedExitCodeAnnotation asks the simulated runtime to run a pod's containers to completion at once,
// exiting with the annotation's code: the pods of a Job succeed (or fail) as soon as they start, for
// benchmarks of the workload controllers. Pods with restartPolicy Always ignore it.
const SimulatedExitCodeAnnotation = "simulated.skiff.dev/exit-code"

func simulatedExitCode(pod *corev1.Pod) (int32, bool) {
	v, ok := pod.Annotations[SimulatedExitCodeAnnotation]
	if !ok || pod.Spec.RestartPolicy == corev1.RestartPolicyAlways || pod.Spec.RestartPolicy == "" {
		return 0, false
	}
	code, err := strconv.ParseInt(v, 10, 32)
	if err != nil {
		return 0, false
	}
	return int32(code), true
}

func (r *simulatedRuntime) Cleanup(context.Context, func(types.UID) bool) error { return nil }

func (r *simulatedRuntime) KillPod(_ context.Context, pod *corev1.Pod, _ func() time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p, ok := r.pods[pod.UID]; ok && p.ip != "" {
		r.ipam[p.node].release(p.ip)
	}
	delete(r.pods, pod.UID)
	return nil
}
