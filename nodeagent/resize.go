package nodeagent

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/skiff-dev/skiff/nodeagent/stats"
)

// In-place resize (KEP-1287), the kubelet's part. The API changes a running pod's containers' cpu and
// memory requests and limits (pods/resize); the agent then
//   - admits the resize or not: the pod's new requests must fit the node's allocatable beside what its other
//     pods were given (PodResizePending, reason Infeasible when they could never fit, Deferred when they may
//     later). A pod whose resize is pending runs on with the resources it was given, and reports those as its
//     containers' allocatedResources;
//   - actuates an admitted one on each running container: in place, by updating the container's cgroup
//     through containerd, or by restarting the container when its resizePolicy for a changed resource is
//     RestartContainer. A memory limit is not lowered below what the container uses now: the resize stays in
//     progress (PodResizeInProgress, reason Error) and is tried again;
//   - reports in each container's status.resources what its cgroup has, recorded on the container (the
//     labelResources label) when it is created and each time it is resized.

// ResizeState is what a runtime reports of a resize the spec asks for and the containers do not have yet.
type ResizeState struct {
	// Pending: the node did not admit it; Reason is Deferred or Infeasible. Otherwise it is in progress, and
	// Reason is Error when applying it failed.
	Pending         bool
	Reason, Message string
}

// resizeRetry is how soon a pending or failed resize is tried again.
const resizeRetry = 5 * time.Second

// recordedResources is the cpu and memory a container's cgroup was given, as recorded on it; ok is false
// for a container made before the record existed.
func recordedResources(rec *ctrRecord) (res corev1.ResourceRequirements, ok bool) {
	raw := rec.labels[labelResources]
	return res, raw != "" && json.Unmarshal([]byte(raw), &res) == nil
}

// withCPUMemoryOf is list with its cpu and memory entries replaced by from's (nil when nothing is left).
func withCPUMemoryOf(list, from corev1.ResourceList) corev1.ResourceList {
	out := corev1.ResourceList{}
	for name, q := range list {
		if name != corev1.ResourceCPU && name != corev1.ResourceMemory {
			out[name] = q.DeepCopy()
		}
	}
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if q, ok := from[name]; ok {
			out[name] = q.DeepCopy()
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// resizableContainers are the containers a resize acts on while they run: the sidecars and the app
// containers, with their kinds.
func resizableContainers(pod *corev1.Pod) (kinds []string, list []*corev1.Container) {
	for i := range pod.Spec.InitContainers {
		if isSidecar(&pod.Spec.InitContainers[i]) {
			kinds, list = append(kinds, kindInit), append(list, &pod.Spec.InitContainers[i])
		}
	}
	for i := range pod.Spec.Containers {
		kinds, list = append(kinds, kindApp), append(list, &pod.Spec.Containers[i])
	}
	return kinds, list
}

// resizeWanted tells whether a running container's cgroup differs from what the spec asks.
func resizeWanted(pod *corev1.Pod, recs *podRecords) bool {
	kinds, list := resizableContainers(pod)
	for i, c := range list {
		last := recs.latest(kinds[i], c.Name)
		if last == nil || !last.running {
			continue
		}
		if have, ok := recordedResources(last); ok && !apiequality.Semantic.DeepEqual(have, cgroupResources(c)) {
			return true
		}
	}
	return false
}

// allocateResize admits a resize the pod's spec asks for, or keeps the pod at what it was given: the pod
// returned is the one to run, a copy with the running containers' recorded cpu and memory when the resize is
// pending.
func (r *containerdRuntime) allocateResize(pod *corev1.Pod, recs *podRecords) (*corev1.Pod, *ResizeState) {
	if !resizeWanted(pod, recs) {
		return pod, nil
	}
	reason, message := r.resizeFits(pod)
	if reason == "" {
		return pod, nil
	}
	allocated := pod.DeepCopy()
	kinds, list := resizableContainers(allocated)
	for i, c := range list {
		if last := recs.latest(kinds[i], c.Name); last != nil {
			if have, ok := recordedResources(last); ok {
				c.Resources.Requests = withCPUMemoryOf(c.Resources.Requests, have.Requests)
				c.Resources.Limits = withCPUMemoryOf(c.Resources.Limits, have.Limits)
			}
		}
	}
	r.eventOnce(pod, fmt.Sprintf("%s/resize/%d/%s", pod.UID, pod.Generation, reason), corev1.EventTypeWarning, "Resize"+reason, "Pod resize %s: %s", strings.ToLower(reason), message)
	r.resync(pod, resizeRetry)
	return allocated, &ResizeState{Pending: true, Reason: reason, Message: message}
}

// resizeFits is the kubelet's resize admission for cpu and memory, with its messages: Infeasible when the
// pod's requests exceed the node's allocatable, Deferred when they exceed what the node's other pods leave.
func (r *containerdRuntime) resizeFits(pod *corev1.Pod) (reason, message string) {
	want := resourcehelper.PodRequests(pod, resourcehelper.PodResourcesOptions{})
	var used corev1.ResourceList
	if r.nodeRequests != nil {
		used = r.nodeRequests(pod)
	}
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		capacity, ok := r.allocatable[name]
		if !ok {
			continue
		}
		value := func(q resource.Quantity) int64 {
			if name == corev1.ResourceCPU {
				return q.MilliValue()
			}
			return q.Value()
		}
		requested, others, limit := value(want[name]), value(used[name]), value(capacity)
		switch {
		case requested > limit:
			return corev1.PodReasonInfeasible, fmt.Sprintf("Node didn't have enough capacity: %s, requested: %d, capacity: %d", name, requested, limit)
		case requested+others > limit:
			return corev1.PodReasonDeferred, fmt.Sprintf("Node didn't have enough resource: %s, requested: %d, used: %d, capacity: %d", name, requested, others, limit)
		}
	}
	return "", ""
}

// actuateResizes applies an admitted resize to the pod's running containers; a failure is reported as a
// resize in progress, and tried again.
func (r *containerdRuntime) actuateResizes(ctx context.Context, pod *corev1.Pod, recs *podRecords, sb *sandbox, vols podVolumes) *ResizeState {
	var resized, failed []string
	kinds, list := resizableContainers(pod)
	for i, c := range list {
		last := recs.latest(kinds[i], c.Name)
		if last == nil || !last.running {
			continue
		}
		have, ok := recordedResources(last)
		want := cgroupResources(c)
		if !ok || apiequality.Semantic.DeepEqual(have, want) {
			continue
		}
		var err error
		if restartForResize(c, have, want) {
			msg := fmt.Sprintf("Container %s resize requires restart", c.Name)
			if err = r.killContainer(ctx, pod, c, last, time.Now(), func() time.Duration { return terminationGrace(pod) }, msg); err == nil {
				err = r.startContainer(ctx, pod, c, kinds[i], nextAttempt(last), sb, vols, recs)
			}
		} else {
			err = r.resizeInPlace(ctx, c, last, have, want)
		}
		if err != nil {
			failed = append(failed, fmt.Sprintf("container %q: %v", c.Name, err))
			continue
		}
		resized = append(resized, c.Name)
	}
	if len(failed) > 0 {
		msg := strings.Join(failed, "; ")
		r.eventOnce(pod, fmt.Sprintf("%s/resize/%d/error", pod.UID, pod.Generation), corev1.EventTypeWarning, "ResizeError", "Pod resize error: %s", msg)
		r.resync(pod, resizeRetry)
		return &ResizeState{Reason: corev1.PodReasonError, Message: msg}
	}
	if len(resized) > 0 {
		r.event(pod, corev1.EventTypeNormal, "ResizeCompleted", "Pod resize completed: containers %s", strings.Join(resized, ", "))
	}
	return nil
}

// restartForResize tells whether a changed resource's resizePolicy is RestartContainer.
func restartForResize(c *corev1.Container, have, want corev1.ResourceRequirements) bool {
	for _, p := range c.ResizePolicy {
		if p.RestartPolicy != corev1.RestartContainer {
			continue
		}
		for _, list := range []func(corev1.ResourceRequirements) corev1.ResourceList{
			func(r corev1.ResourceRequirements) corev1.ResourceList { return r.Requests },
			func(r corev1.ResourceRequirements) corev1.ResourceList { return r.Limits },
		} {
			h, hok := list(have)[p.ResourceName]
			w, wok := list(want)[p.ResourceName]
			if hok != wok || h.Cmp(w) != 0 {
				return true
			}
		}
	}
	return false
}

// resizeInPlace updates a running container's cgroup to the spec's cpu and memory, mapped as at its
// creation (resourceOpts), and records them. A memory limit below the container's use now is refused, as the
// kubelet refuses it, rather than have the kernel reclaim or kill to meet it.
func (r *containerdRuntime) resizeInPlace(ctx context.Context, c *corev1.Container, rec *ctrRecord, have, want corev1.ResourceRequirements) error {
	if limit, ok := want.Limits[corev1.ResourceMemory]; ok {
		if old, had := have.Limits[corev1.ResourceMemory]; !had || limit.Cmp(old) < 0 {
			reader, err := stats.NewReader(containerdNamespace)
			if err != nil {
				return err
			}
			if u, err := reader.Container(rec.id); err == nil && u.WorkingSetBytes >= uint64(limit.Value()) {
				return fmt.Errorf("memory limit (%d) below current usage (%d)", limit.Value(), u.WorkingSetBytes)
			}
		}
	}
	spec := &oci.Spec{Linux: &specs.Linux{}}
	for _, opt := range resourceOpts(&corev1.Container{Resources: want}) {
		if err := opt(ctx, nil, nil, spec); err != nil {
			return err
		}
	}
	task, err := rec.ctr.Task(ctx, nil)
	if err != nil {
		return err
	}
	if err := task.Update(ctx, containerd.WithResources(spec.Linux.Resources)); err != nil {
		return fmt.Errorf("updating the cgroup: %w", err)
	}
	raw, err := json.Marshal(want)
	if err != nil {
		return err
	}
	if _, err := rec.ctr.SetLabels(ctx, map[string]string{labelResources: string(raw)}); err != nil {
		return err
	}
	rec.labels[labelResources] = string(raw)
	return nil
}
