package nodeagent

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

func TestSimulatedPodStatus(t *testing.T) {
	r := newSimulatedRuntime()
	r.now = func() time.Time { return time.Unix(1000, 0) }
	pod := &corev1.Pod{Spec: corev1.PodSpec{
		InitContainers: []corev1.Container{{Name: "init", Image: "busybox"}},
		Containers:     []corev1.Container{{Name: "a", Image: "web:1"}, {Name: "b", Image: "web:2"}},
		EphemeralContainers: []corev1.EphemeralContainer{{TargetContainerName: "a",
			EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debugger", Image: "busybox"}}},
	}}
	pod.UID = "uid-1"
	state, err := r.SyncPod(context.Background(), pod)
	if err != nil {
		t.Fatal(err)
	}
	status := podStatus(pod, state, "10.0.0.5")
	if status.Phase != corev1.PodRunning || status.HostIP != "10.0.0.5" || status.StartTime == nil || !status.StartTime.Time.Equal(time.Unix(1000, 0)) {
		t.Fatalf("status %+v", status)
	}
	conds := map[corev1.PodConditionType]corev1.ConditionStatus{}
	for _, c := range status.Conditions {
		conds[c.Type] = c.Status
	}
	for _, c := range []corev1.PodConditionType{corev1.PodReadyToStartContainers, corev1.PodInitialized, corev1.ContainersReady, corev1.PodReady} {
		if conds[c] != corev1.ConditionTrue {
			t.Errorf("condition %s = %q", c, conds[c])
		}
	}
	if len(status.ContainerStatuses) != 2 || status.ContainerStatuses[1].State.Running == nil || status.ContainerStatuses[1].ContainerID != "simulated://uid-1/b" {
		t.Errorf("containers %+v", status.ContainerStatuses)
	}
	if len(status.InitContainerStatuses) != 1 || status.InitContainerStatuses[0].State.Terminated.Reason != "Completed" {
		t.Errorf("init containers %+v", status.InitContainerStatuses)
	}
	// Ephemeral containers run; like the kubelet's, they are never ready.
	if e := status.EphemeralContainerStatuses; len(e) != 1 || e[0].Name != "debugger" || e[0].State.Running == nil || e[0].Ready ||
		e[0].RestartCount != 0 || e[0].ContainerID != "simulated://uid-1/debugger" || e[0].ImageID != "simulated://busybox" {
		t.Errorf("ephemeral containers %+v", status.EphemeralContainerStatuses)
	}
	// A second sync of the same pod reports the same thing, so the agent writes nothing.
	pod.Status = status
	state, _ = r.SyncPod(context.Background(), pod)
	again := podStatus(pod, state, "10.0.0.5")
	for i := range again.Conditions {
		if !again.Conditions[i].LastTransitionTime.Equal(&status.Conditions[i].LastTransitionTime) {
			t.Errorf("condition %s moved its transition time", again.Conditions[i].Type)
		}
	}
	// A killed pod starts afresh.
	if err := r.KillPod(context.Background(), pod, func() time.Duration { return 0 }); err != nil {
		t.Fatal(err)
	}
	r.now = func() time.Time { return time.Unix(2000, 0) }
	state, _ = r.SyncPod(context.Background(), pod)
	if !state.Started.Equal(time.Unix(2000, 0)) {
		t.Errorf("restarted pod started at %v", state.Started)
	}
}
