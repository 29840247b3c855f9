package nodeagent

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// podStatus turns a runtime's view of a pod into the status Kubernetes shows: phase, the five conditions,
// IPs, start time and container statuses. Conditions keep their transition time while unchanged.
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

	initialized := true
	for _, c := range state.InitContainers {
		if c.State.Terminated == nil || c.State.Terminated.ExitCode != 0 {
			initialized = false
		}
	}
	ready, running := len(state.Containers) > 0, false
	for _, c := range state.Containers {
		ready = ready && c.Ready
		running = running || c.State.Running != nil
	}
	switch {
	case running && initialized:
		status.Phase = corev1.PodRunning
	default:
		status.Phase = corev1.PodPending
	}
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
	cond(corev1.PodReadyToStartContainers, true)
	cond(corev1.PodInitialized, initialized)
	cond(corev1.ContainersReady, ready && initialized)
	cond(corev1.PodReady, ready && initialized)
	return status
}
