package nodeagent

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	podutil "k8s.io/kubernetes/pkg/api/v1/pod"
	kubeletstatus "k8s.io/kubernetes/pkg/kubelet/status"
)

// podStatus turns a runtime's view of a pod into the status Kubernetes shows: phase, the kubelet's five
// conditions (with its reasons and messages, from the kubelet's own generators), IPs, start time, container
// statuses and the generation acted on (status.observedGeneration, and each condition's). Conditions keep
// their transition time while their status is unchanged; conditions the kubelet does not own (readiness
// gates, DisruptionTarget) are kept as they are. Ephemeral containers are reported but, as in the kubelet,
// count for neither the phase nor readiness.
func podStatus(pod *corev1.Pod, state *PodState, hostIP string) corev1.PodStatus {
	old := &pod.Status
	status := *pod.Status.DeepCopy()
	status.HostIP = hostIP
	status.HostIPs = []corev1.HostIP{{IP: hostIP}}
	if state.IP != "" {
		status.PodIP = state.IP
		status.PodIPs = []corev1.PodIP{{IP: state.IP}}
	}
	if status.StartTime == nil {
		start := metav1.NewTime(state.Started)
		status.StartTime = &start
	}
	status.InitContainerStatuses = state.InitContainers
	status.ContainerStatuses = state.Containers
	status.EphemeralContainerStatuses = state.EphemeralContainers
	status.ObservedGeneration = podutil.CalculatePodStatusObservedGeneration(pod)

	initialized := true
	for i, c := range state.InitContainers {
		spec := &corev1.Container{Name: c.Name}
		if i < len(pod.Spec.InitContainers) {
			spec = &pod.Spec.InitContainers[i]
		}
		if !initContainerDone(spec, c) {
			initialized = false
		}
	}
	status.Phase = podPhase(pod.Spec.RestartPolicy, state, initialized)
	if state.Killed && status.Phase != corev1.PodSucceeded && status.Phase != corev1.PodFailed {
		status.Phase = corev1.PodFailed
		if allSucceeded(state.Containers) {
			status.Phase = corev1.PodSucceeded
		}
	}
	if state.FailReason != "" {
		status.Phase, status.Reason, status.Message = corev1.PodFailed, state.FailReason, state.FailMessage
	}

	all := append(append([]corev1.ContainerStatus{}, status.InitContainerStatuses...), status.ContainerStatuses...)
	generation := func(t corev1.PodConditionType) int64 {
		return podutil.CalculatePodConditionObservedGeneration(old, pod.Generation, t)
	}
	sandbox := corev1.PodCondition{Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionFalse, ObservedGeneration: generation(corev1.PodReadyToStartContainers)}
	if state.SandboxReady {
		sandbox.Status = corev1.ConditionTrue
	}
	setCondition(&status, sandbox)
	setCondition(&status, kubeletstatus.GeneratePodInitializedCondition(pod, old, all, status.Phase))
	// Readiness gates are read from the conditions as they are now.
	setCondition(&status, kubeletstatus.GeneratePodReadyCondition(pod, old, status.Conditions, all, status.Phase))
	setCondition(&status, kubeletstatus.GenerateContainersReadyCondition(pod, old, all, status.Phase))
	setCondition(&status, corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, ObservedGeneration: generation(corev1.PodScheduled)})
	// The kubelet's resize conditions: present only while a resize is pending or in progress.
	keep := corev1.PodConditionType("")
	if r := state.Resize; r != nil {
		keep = corev1.PodResizeInProgress
		if r.Pending {
			keep = corev1.PodResizePending
		}
		setCondition(&status, corev1.PodCondition{Type: keep, Status: corev1.ConditionTrue, Reason: r.Reason, Message: r.Message, ObservedGeneration: pod.Generation})
	}
	for _, t := range []corev1.PodConditionType{corev1.PodResizePending, corev1.PodResizeInProgress} {
		if t != keep {
			removeCondition(&status, t)
		}
	}
	return status
}

func removeCondition(status *corev1.PodStatus, t corev1.PodConditionType) {
	status.Conditions = slices.DeleteFunc(status.Conditions, func(c corev1.PodCondition) bool { return c.Type == t })
}

// setCondition puts a condition in the status, in place of the one of its type (whose transition time it
// keeps when the status is the same), or at the end.
func setCondition(status *corev1.PodStatus, c corev1.PodCondition) {
	for i := range status.Conditions {
		prev := &status.Conditions[i]
		if prev.Type != c.Type {
			continue
		}
		c.LastProbeTime = prev.LastProbeTime
		c.LastTransitionTime = prev.LastTransitionTime
		if prev.Status != c.Status || c.LastTransitionTime.IsZero() {
			c.LastTransitionTime = metav1.Now()
		}
		*prev = c
		return
	}
	c.LastTransitionTime = metav1.Now()
	status.Conditions = append(status.Conditions, c)
}

// podPhase is the kubelet's phase rule. Containers that never ran keep the pod Pending; a container waiting
// to restart counts as stopped, so a crash-looping pod is Running; once every container has stopped, the pod
// is Succeeded or Failed unless restartPolicy will start them again.
func podPhase(policy corev1.RestartPolicy, state *PodState, initialized bool) corev1.PodPhase {
	if !initialized {
		for _, c := range state.InitContainers {
			if t := c.State.Terminated; t != nil && t.ExitCode != 0 && policy == corev1.RestartPolicyNever {
				return corev1.PodFailed
			}
		}
		return corev1.PodPending
	}
	running, waiting, stopped, succeeded := 0, 0, 0, 0
	for _, c := range state.Containers {
		switch {
		case c.State.Running != nil:
			running++
		case c.State.Terminated != nil:
			stopped++
			if c.State.Terminated.ExitCode == 0 {
				succeeded++
			}
		case c.LastTerminationState.Terminated != nil:
			stopped++
		default:
			waiting++
		}
	}
	switch {
	case waiting > 0:
		return corev1.PodPending
	case running > 0:
		return corev1.PodRunning
	case stopped > 0 && policy == corev1.RestartPolicyAlways:
		return corev1.PodRunning
	case stopped > 0 && stopped == succeeded:
		return corev1.PodSucceeded
	case stopped > 0 && policy == corev1.RestartPolicyNever:
		return corev1.PodFailed
	case stopped > 0:
		return corev1.PodRunning // OnFailure: the failed ones restart
	}
	return corev1.PodPending
}

// isSidecar tells whether an init container is a sidecar: restartPolicy Always, running beside the app
// containers for the pod's life.
func isSidecar(c *corev1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
}

// allSucceeded tells whether every container terminated with exit code 0.
func allSucceeded(statuses []corev1.ContainerStatus) bool {
	for _, c := range statuses {
		if t := c.State.Terminated; t == nil || t.ExitCode != 0 {
			return false
		}
	}
	return len(statuses) > 0
}

// isSidecarName tells whether the pod's init container of that name is a sidecar.
func isSidecarName(pod *corev1.Pod, name string) bool {
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == name {
			return isSidecar(&pod.Spec.InitContainers[i])
		}
	}
	return false
}

// initContainerDone tells whether an init container no longer holds up the pod: it succeeded, or it is a
// sidecar and runs.
func initContainerDone(c *corev1.Container, s corev1.ContainerStatus) bool {
	if isSidecar(c) {
		return s.State.Running != nil
	}
	return s.State.Terminated != nil && s.State.Terminated.ExitCode == 0
}
