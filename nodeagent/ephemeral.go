package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Ephemeral containers are what `kubectl debug POD --image=... --target=app` adds to a running pod through
// the pods/ephemeralcontainers subresource. The kubelet runs each one once:
//   - it starts once the sandbox runs, even before the pod is initialized;
//   - it is never restarted, whatever the pod's restartPolicy, and not even in a new sandbox;
//   - it has no probes, lifecycle hooks, ports or resources of its own;
//   - with a targetContainerName it joins the target's PID namespace (the CRI's NamespaceMode TARGET), so
//     that it sees the target's processes;
//   - it does not count for the pod's phase or readiness, and it is killed with the pod.

// ephemeralContainer is the Container that startContainer runs for an ephemeral container: the fields are
// the same. What the API forbids for ephemeral containers is dropped, in case an older server let it through.
func ephemeralContainer(ec *corev1.EphemeralContainer) *corev1.Container {
	c := corev1.Container(ec.EphemeralContainerCommon)
	c.Ports = nil
	c.LivenessProbe, c.ReadinessProbe, c.StartupProbe = nil, nil, nil
	c.Lifecycle = nil
	c.Resources, c.ResizePolicy = corev1.ResourceRequirements{}, nil
	c.RestartPolicy, c.RestartPolicyRules = nil, nil
	return &c
}

// ephemeralNeedsStart tells whether an ephemeral container is still to be started, from its latest attempt:
// only when it never ran. A container that was created but whose start never happened (the agent died in
// between) is started; one that ran, however it ended, never again.
func ephemeralNeedsStart(last *ctrRecord) bool {
	return last == nil || (!last.running && !last.exited)
}

// targetPID is the host PID of a running container of the pod that an ephemeral container targets: an app
// container, or else an init container (a sidecar, say); false when it does not run.
func targetPID(recs *podRecords, name string) (uint32, bool) {
	for _, kind := range []string{kindApp, kindInit} {
		if last := recs.latest(kind, name); last != nil && last.running && last.pid != 0 {
			return last.pid, true
		}
	}
	return 0, false
}

// syncEphemeralContainers starts the ephemeral containers that never ran, each through startContainer as an
// app container goes (image pull, env, volume mounts, securityContext, stdin and tty). One whose target does
// not run yet waits in CreateContainerConfigError and is tried again, as the kubelet does.
func (r *containerdRuntime) syncEphemeralContainers(ctx context.Context, pod *corev1.Pod, recs *podRecords, sb *sandbox, vols podVolumes) error {
	var errs []error
	for i := range pod.Spec.EphemeralContainers {
		ec := &pod.Spec.EphemeralContainers[i]
		last := recs.latest(kindEphemeral, ec.Name)
		if !ephemeralNeedsStart(last) {
			continue
		}
		attempt := 0
		if last != nil {
			attempt = last.attempt // the same ID: startContainer replaces the leftover
		}
		in := sb
		if target := ec.TargetContainerName; target != "" {
			pid, ok := targetPID(recs, target)
			if !ok {
				msg := fmt.Sprintf("unable to find target container %s", target)
				r.setWaiting(pod.UID, ec.Name, corev1.ContainerStateWaiting{Reason: "CreateContainerConfigError", Message: msg})
				r.event(pod, corev1.EventTypeWarning, "Failed", "Error: %s", msg)
				r.resync(pod, 10*time.Second)
				continue
			}
			withTarget := *sb
			withTarget.pidNS = fmt.Sprintf("/proc/%d/ns/pid", pid)
			in = &withTarget
		}
		errs = append(errs, r.startContainer(ctx, pod, ephemeralContainer(ec), kindEphemeral, attempt, in, vols, recs))
	}
	return errors.Join(errs...)
}

// ephemeralStatuses are the pod's status.ephemeralContainerStatuses, in spec order. As the kubelet reports
// them, they are never ready and carry no started field; the restart count stays 0.
func (r *containerdRuntime) ephemeralStatuses(pod *corev1.Pod, recs *podRecords) []corev1.ContainerStatus {
	var out []corev1.ContainerStatus
	for i := range pod.Spec.EphemeralContainers {
		s := r.containerStatus(pod, ephemeralContainer(&pod.Spec.EphemeralContainers[i]), kindEphemeral, recs, "ContainerCreating")
		s.Ready, s.Started = false, nil
		out = append(out, s)
	}
	return out
}
