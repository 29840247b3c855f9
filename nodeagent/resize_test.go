package nodeagent

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func resources(requests, limits map[corev1.ResourceName]string) corev1.ResourceRequirements {
	var r corev1.ResourceRequirements
	for name, v := range requests {
		if r.Requests == nil {
			r.Requests = corev1.ResourceList{}
		}
		r.Requests[name] = resource.MustParse(v)
	}
	for name, v := range limits {
		if r.Limits == nil {
			r.Limits = corev1.ResourceList{}
		}
		r.Limits[name] = resource.MustParse(v)
	}
	return r
}

// TestResizeAdmission: a resize is admitted when the pod's new requests fit beside the node's other pods,
// deferred when they do not, infeasible when they exceed the node; a pending resize runs the pod with what
// its containers were given, and reports those as allocated.
func TestResizeAdmission(t *testing.T) {
	given := resources(map[corev1.ResourceName]string{"cpu": "100m", "memory": "32Mi"}, map[corev1.ResourceName]string{"cpu": "200m"})
	raw, _ := json.Marshal(given)
	recs := &podRecords{attempts: map[string][]*ctrRecord{kindApp + "/app": {{kind: kindApp, name: "app", running: true, labels: map[string]string{labelResources: string(raw)}}}}}
	used := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1500m")}
	r := &containerdRuntime{allocatable: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("1Gi")},
		nodeRequests: func(*corev1.Pod) corev1.ResourceList { return used }, resync: func(*corev1.Pod, time.Duration) {}, events: map[string]bool{}}
	for _, tc := range []struct {
		name, cpu, reason, message string
	}{
		{"unchanged", "100m", "", ""},
		{"fits", "400m", "", ""},
		{"not beside the others", "600m", corev1.PodReasonDeferred, "Node didn't have enough resource: cpu, requested: 600, used: 1500, capacity: 2000"},
		{"more than the node", "3", corev1.PodReasonInfeasible, "Node didn't have enough capacity: cpu, requested: 3000, capacity: 2000"},
	} {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "u", Generation: 2}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app",
			Resources: resources(map[corev1.ResourceName]string{"cpu": tc.cpu, "memory": "32Mi"}, map[corev1.ResourceName]string{"cpu": "4"})}}}}
		if tc.cpu == "100m" {
			pod.Spec.Containers[0].Resources = given
		}
		run, state := r.allocateResize(pod, recs)
		switch {
		case tc.reason == "" && (state != nil || run != pod):
			t.Errorf("%s: pending %+v, want admitted", tc.name, state)
		case tc.reason != "" && (state == nil || !state.Pending || state.Reason != tc.reason || state.Message != tc.message):
			t.Errorf("%s: %+v, want pending %s: %s", tc.name, state, tc.reason, tc.message)
		case tc.reason != "" && !apiequality.Semantic.DeepEqual(run.Spec.Containers[0].Resources, given):
			t.Errorf("%s: runs with %v, want what it was given %v", tc.name, run.Spec.Containers[0].Resources, given)
		}
	}
}

func TestRestartForResize(t *testing.T) {
	have := resources(map[corev1.ResourceName]string{"cpu": "100m", "memory": "32Mi"}, map[corev1.ResourceName]string{"memory": "64Mi"})
	c := &corev1.Container{ResizePolicy: []corev1.ContainerResizePolicy{{ResourceName: corev1.ResourceMemory, RestartPolicy: corev1.RestartContainer},
		{ResourceName: corev1.ResourceCPU, RestartPolicy: corev1.NotRequired}}}
	for _, tc := range []struct {
		name    string
		want    corev1.ResourceRequirements
		restart bool
	}{
		{"cpu only", resources(map[corev1.ResourceName]string{"cpu": "200m", "memory": "32Mi"}, map[corev1.ResourceName]string{"memory": "64Mi"}), false},
		{"memory limit", resources(map[corev1.ResourceName]string{"cpu": "100m", "memory": "32Mi"}, map[corev1.ResourceName]string{"memory": "80Mi"}), true},
		{"memory request", resources(map[corev1.ResourceName]string{"cpu": "100m", "memory": "40Mi"}, map[corev1.ResourceName]string{"memory": "64Mi"}), true},
		{"cpu limit added", resources(map[corev1.ResourceName]string{"cpu": "100m", "memory": "32Mi"}, map[corev1.ResourceName]string{"memory": "64Mi", "cpu": "1"}), false},
	} {
		if got := restartForResize(c, have, tc.want); got != tc.restart {
			t.Errorf("%s: restart %v, want %v", tc.name, got, tc.restart)
		}
	}
}

// TestResizeConditions: PodResizePending and PodResizeInProgress are in the status only while a resize is,
// and a pending one keeps its transition time from sync to sync.
func TestResizeConditions(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Generation: 3}, Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyAlways, Containers: []corev1.Container{{Name: "app"}}}}
	running := []corev1.ContainerStatus{{Name: "app", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
	conditions := func(s corev1.PodStatus) string {
		var out []string
		for _, c := range s.Conditions {
			if c.Type == corev1.PodResizePending || c.Type == corev1.PodResizeInProgress {
				out = append(out, string(c.Type)+"/"+c.Reason)
			}
		}
		return strings.Join(out, ",")
	}
	pending := &PodState{SandboxReady: true, Containers: running, Resize: &ResizeState{Pending: true, Reason: corev1.PodReasonDeferred, Message: "m"}}
	pod.Status = podStatus(pod, pending, "10.0.0.1")
	if got := conditions(pod.Status); got != "PodResizePending/Deferred" {
		t.Fatalf("pending: %q", got)
	}
	first := pod.Status.Conditions
	time.Sleep(1100 * time.Millisecond)
	again := podStatus(pod, pending, "10.0.0.1")
	for i := range again.Conditions {
		if again.Conditions[i].Type == corev1.PodResizePending && !again.Conditions[i].LastTransitionTime.Equal(&first[i].LastTransitionTime) {
			t.Errorf("the pending condition's transition time moved on a sync that changed nothing")
		}
	}
	pod.Status = podStatus(pod, &PodState{SandboxReady: true, Containers: running, Resize: &ResizeState{Reason: corev1.PodReasonError, Message: "below usage"}}, "10.0.0.1")
	if got := conditions(pod.Status); got != "PodResizeInProgress/Error" {
		t.Errorf("failing: %q", got)
	}
	pod.Status = podStatus(pod, &PodState{SandboxReady: true, Containers: running}, "10.0.0.1")
	if got := conditions(pod.Status); got != "" {
		t.Errorf("done: %q", got)
	}
}
