package nodeagent

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/skiff-dev/skiff/config"
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

// TestInitContainerFailureStatus: as the kubelet reports a restartPolicy Never pod whose second init
// container failed: the first init container, which succeeded, is ready; the pod is Failed; Initialized is
// False with reason ContainersNotInitialized and the failed container named; and the status and every
// condition carry the generation acted on.
func TestInitContainerFailureStatus(t *testing.T) {
	started, finished := time.Unix(1000, 0), time.Unix(1010, 0)
	r := &containerdRuntime{cfg: &config.Agent{DataDir: t.TempDir()}, waiting: map[types.UID]map[string]corev1.ContainerStateWaiting{}, resync: func(*corev1.Pod, time.Duration) {}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "u1", Name: "p", Namespace: "default", Generation: 3}, Spec: corev1.PodSpec{
		RestartPolicy:  corev1.RestartPolicyNever,
		InitContainers: []corev1.Container{{Name: "init1", Image: "busybox"}, {Name: "init2", Image: "busybox"}},
		Containers:     []corev1.Container{{Name: "run1", Image: "busybox"}},
	}}
	exited := func(name string, code int) []*ctrRecord {
		return []*ctrRecord{{kind: kindInit, name: name, id: "u1-init-" + name + "-0", exited: true, exitCode: code, startedAt: started, finishedAt: finished}}
	}
	recs := &podRecords{attempts: map[string][]*ctrRecord{kindInit + "/init1": exited("init1", 0), kindInit + "/init2": exited("init2", 1)}}
	state := r.state(pod, recs, &sandbox{pid: 1, ip: "10.42.0.5"})
	if len(state.InitContainers) != 2 || !state.InitContainers[0].Ready || state.InitContainers[1].Ready {
		t.Fatalf("init container statuses %+v: want the succeeded one ready, the failed one not", state.InitContainers)
	}
	status := podStatus(pod, state, "192.168.1.10")
	if status.Phase != corev1.PodFailed || status.ObservedGeneration != 3 {
		t.Errorf("phase %s, observedGeneration %d; want Failed, 3", status.Phase, status.ObservedGeneration)
	}
	for _, c := range status.Conditions {
		if c.ObservedGeneration != 3 {
			t.Errorf("condition %s observedGeneration %d, want 3", c.Type, c.ObservedGeneration)
		}
		if c.Type == corev1.PodInitialized && (c.Status != corev1.ConditionFalse || c.Reason != "ContainersNotInitialized" ||
			c.Message != "containers with incomplete status: [init2]") {
			t.Errorf("Initialized condition %+v", c)
		}
	}
	if len(status.Conditions) != 5 {
		t.Errorf("conditions %+v", status.Conditions)
	}
}

// TestContainerStatusResources: a container's status.resources are the cpu and memory requests and limits
// its cgroup was created with (recorded on the container), allocatedResources the spec's requests, as the
// kubelet reports them; a container that never ran reports none.
func TestContainerStatusResources(t *testing.T) {
	r := &containerdRuntime{cfg: &config.Agent{DataDir: t.TempDir()}, waiting: map[types.UID]map[string]corev1.ContainerStateWaiting{}, resync: func(*corev1.Pod, time.Duration) {}}
	created := corev1.Container{Name: "app", Image: "busybox", Resources: corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("32Mi")},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("64Mi")}}}
	applied, err := json.Marshal(cgroupResources(&created))
	if err != nil {
		t.Fatal(err)
	}
	// The spec now asks for more than the running container was given: the status says what applies.
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "u1", Name: "p", Namespace: "default"}, Spec: corev1.PodSpec{
		RestartPolicy: corev1.RestartPolicyAlways, Containers: []corev1.Container{*created.DeepCopy(), {Name: "waiting", Image: "busybox"}}}}
	pod.Spec.Containers[0].Resources.Limits[corev1.ResourceCPU] = resource.MustParse("1")
	recs := &podRecords{attempts: map[string][]*ctrRecord{kindApp + "/app": {{kind: kindApp, name: "app", id: "u1-app-app-0",
		labels: map[string]string{labelResources: string(applied)}, running: true, startedAt: time.Unix(1000, 0)}}}}
	state := r.state(pod, recs, &sandbox{pid: 1, ip: "10.42.0.5"})
	got := state.Containers[0]
	want := created.Resources
	if got.Resources == nil || !apiequality.Semantic.DeepEqual(*got.Resources, want) {
		t.Errorf("resources %v, want %v", got.Resources, want)
	}
	if !apiequality.Semantic.DeepEqual(got.AllocatedResources, pod.Spec.Containers[0].Resources.Requests) {
		t.Errorf("allocatedResources %v", got.AllocatedResources)
	}
	if w := state.Containers[1]; w.Resources != nil || w.AllocatedResources != nil {
		t.Errorf("a container that never ran reports resources %v, %v", w.Resources, w.AllocatedResources)
	}
}
