package nodeagent

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// podStatus turns a runtime's view of a pod into the status Kubernetes shows: phase, the five conditions,
// IPs, start time and container statuses. Conditions keep their transition time while unchanged. Ephemeral
// containers are reported but, as in the kubelet, count for neither the phase nor readiness.
func podStatus(pod *corev1.Pod, state *PodState, hostIP string) corev1.PodStatus {
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
	ready := len(state.Containers) > 0
	for _, c := range state.Containers {
		ready = ready && c.Ready
	}
	status.Phase = podPhase(pod.Spec.RestartPolicy, state, initialized)
	cond := func(t corev1.PodConditionType, ok bool) {
		s := corev1.ConditionFalse
		if ok {
			s = corev1.ConditionTrue
		}
		for i := range status.Conditions {
			if status.Conditions[i].Type == t {
				if status.Conditions[i].Status != s {
					status.Conditions[i].Status, status.Conditions[i].LastTransitionTime = s, metav1.Now()
				}
				return
			}
		}
		status.Conditions = append(status.Conditions, corev1.PodCondition{Type: t, Status: s, LastTransitionTime: metav1.Now()})
	}
	cond(corev1.PodReadyToStartContainers, state.SandboxReady)
	cond(corev1.PodInitialized, initialized)
	cond(corev1.ContainersReady, ready && initialized)
	cond(corev1.PodReady, ready && initialized)
	return status
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

// initContainerDone tells whether an init container no longer holds up the pod: it succeeded, or it is a
// sidecar and runs.
func initContainerDone(c *corev1.Container, s corev1.ContainerStatus) bool {
	if isSidecar(c) {
		return s.State.Running != nil
	}
	return s.State.Terminated != nil && s.State.Terminated.ExitCode == 0
}
