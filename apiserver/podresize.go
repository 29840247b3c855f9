package apiserver

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	apimachineryvalidation "k8s.io/apimachinery/pkg/api/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	"k8s.io/apiserver/pkg/registry/rest"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
)

// Pods: resize. In-place resize of a pod's containers (KEP-1287), as kube-apiserver 1.37 serves pods/resize:
// a request changes only the containers' cpu and memory requests and limits, everything else it carries is
// dropped, and the result is checked by kube's ValidatePodResize rules (written here for v1 pods). The node's
// agent then decides whether the new resources fit and applies them to the running containers.

type resizeStrategy struct{ strategy }

func (s resizeStrategy) PrepareForUpdate(ctx context.Context, obj, old runtime.Object) {
	pod, oldPod := obj.(*corev1.Pod), old.(*corev1.Pod)
	// Containers added, removed, reordered or renamed are left in, for validation to refuse.
	if sameNames(pod.Spec.Containers, oldPod.Spec.Containers) && sameNames(pod.Spec.InitContainers, oldPod.Spec.InitContainers) {
		spec := *oldPod.Spec.DeepCopy()
		takeResize(spec.Containers, pod.Spec.Containers)
		takeResize(spec.InitContainers, pod.Spec.InitContainers)
		// Kept for validation to refuse: pod-level resources are not resized (kube-apiserver resizes them).
		spec.Resources = pod.Spec.Resources
		pod.Spec = spec
	}
	pod.Status = *oldPod.Status.DeepCopy()
	metav1.ResetObjectMetaForStatus(&pod.ObjectMeta, &oldPod.ObjectMeta)
	// A resize changes the desired state: the agent reports in status.observedGeneration when it acted on it.
	if !apiequality.Semantic.DeepEqual(pod.Spec, oldPod.Spec) {
		pod.Generation = oldPod.Generation + 1
	}
}

// sameNames tells whether two container lists name the same containers in the same order.
func sameNames(a, b []corev1.Container) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Name != b[i].Name {
			return false
		}
	}
	return true
}

// takeResize copies what a resize may set, resources and resize policies, from the request's containers.
func takeResize(dst, src []corev1.Container) {
	for i := range dst {
		dst[i].Resources = *src[i].Resources.DeepCopy()
		dst[i].ResizePolicy = append([]corev1.ContainerResizePolicy(nil), src[i].ResizePolicy...)
	}
}

// ValidateUpdate is kube-apiserver's ValidatePodResize for the resizes Skiff serves: the pod must stay valid
// and keep its QoS class, a container's requests and limits may change but not be removed, and nothing but
// cpu and memory may change.
func (s resizeStrategy) ValidateUpdate(ctx context.Context, obj, old runtime.Object) field.ErrorList {
	pod, oldPod := obj.(*corev1.Pod), old.(*corev1.Pod)
	newMeta, _ := meta.Accessor(obj)
	oldMeta, _ := meta.Accessor(old)
	errs := apimachineryvalidation.ValidateObjectMetaAccessorUpdate(newMeta, oldMeta, field.NewPath("metadata"))
	errs = append(errs, s.k.validateMeta(obj)...)
	errs = append(errs, validatePod(pod)...)
	if _, ok := oldPod.Annotations[corev1.MirrorPodAnnotationKey]; ok {
		return field.ErrorList{field.Forbidden(field.NewPath(""), "static pods cannot be resized")}
	}
	if oldPod.Spec.OS != nil && oldPod.Spec.OS.Name == corev1.Windows {
		return field.ErrorList{field.Forbidden(field.NewPath(""), "windows pods cannot be resized")}
	}
	spec := field.NewPath("spec")
	oldQOS := oldPod.Status.QOSClass
	if oldQOS == "" {
		oldQOS = qosClass(oldPod)
	}
	if oldQOS != qosClass(pod) {
		errs = append(errs, field.Invalid(spec, pod.Status.QOSClass, "Pod QOS Class may not change as a result of resizing"))
	}
	if !resizeSupported(oldPod) {
		errs = append(errs, field.Forbidden(spec, "Pod running on node without support for resize"))
	}
	for _, p := range []*corev1.Pod{oldPod, pod} {
		if r := p.Spec.Resources; r != nil && len(r.Requests)+len(r.Limits) > 0 {
			return append(errs, field.Forbidden(spec.Child("resources"), "pods with pod-level resources cannot be resized: Skiff's agents do not resize a pod's own cgroup"))
		}
	}
	if ordering := resizeOrdering(spec, pod, oldPod); len(ordering) > 0 {
		return append(errs, ordering...)
	}
	for _, group := range []struct {
		name     string
		cur, old []corev1.Container
	}{{"initContainers", pod.Spec.InitContainers, oldPod.Spec.InitContainers}, {"containers", pod.Spec.Containers, oldPod.Spec.Containers}} {
		for i := range group.cur {
			c, o := &group.cur[i], &group.old[i]
			p := spec.Child(group.name).Index(i)
			if resourcesRemoved(c.Resources.Requests, o.Resources.Requests) {
				errs = append(errs, field.Forbidden(p.Child("resources", "requests"), "resource requests cannot be removed"))
			}
			if resourcesRemoved(c.Resources.Limits, o.Resources.Limits) {
				errs = append(errs, field.Forbidden(p.Child("resources", "limits"), "resource limits cannot be removed"))
			}
			masked := c.DeepCopy()
			masked.Resources.Requests = keepCPUMemoryOf(c.Resources.Requests, o.Resources.Requests)
			masked.Resources.Limits = keepCPUMemoryOf(c.Resources.Limits, o.Resources.Limits)
			if !apiequality.Semantic.DeepEqual(masked, o) {
				errs = append(errs, field.Forbidden(p, "only cpu and memory resources are mutable"))
				continue
			}
			changed := !apiequality.Semantic.DeepEqual(c.Resources, o.Resources)
			if group.name == "initContainers" && changed && !isRestartable(c) {
				for _, rp := range c.ResizePolicy {
					if rp.RestartPolicy == corev1.RestartContainer {
						errs = append(errs, field.Forbidden(p, "non-sidecar init containers with a resize policy of RestartContainer cannot be resized"))
					}
				}
			}
		}
	}
	return errs
}

// resizeOrdering is kube-apiserver's refusal, with its messages, of containers added, removed, renamed or
// reordered by a resize.
func resizeOrdering(spec *field.Path, pod, oldPod *corev1.Pod) field.ErrorList {
	var errs field.ErrorList
	for _, group := range []struct {
		name     string
		cur, old []corev1.Container
	}{{"containers", pod.Spec.Containers, oldPod.Spec.Containers}, {"initContainers", pod.Spec.InitContainers, oldPod.Spec.InitContainers}} {
		if len(group.cur) != len(group.old) {
			errs = append(errs, field.Forbidden(spec.Child(group.name), group.name+" may not be added or removed on resize"))
			continue
		}
		for i := range group.old {
			if group.cur[i].Name != group.old[i].Name {
				errs = append(errs, field.Forbidden(spec.Child(group.name).Index(i).Child("name"), group.name+" may not be renamed or reordered on resize"))
			}
		}
	}
	return errs
}

// resizeSupported is kube-apiserver's check that the pod's node can resize: a running container reports the
// resources it runs with.
func resizeSupported(pod *corev1.Pod) bool {
	for _, c := range pod.Status.ContainerStatuses {
		if c.State.Running != nil {
			return c.Resources != nil
		}
	}
	return true
}

func resourcesRemoved(cur, old corev1.ResourceList) bool {
	for name := range old {
		if _, ok := cur[name]; !ok {
			return true
		}
	}
	return false
}

// keepCPUMemoryOf is cur with its cpu and memory entries replaced by old's, so that what is left to compare
// are the changes a resize may not make.
func keepCPUMemoryOf(cur, old corev1.ResourceList) corev1.ResourceList {
	if old == nil {
		return nil
	}
	out := cur.DeepCopy()
	if out == nil {
		out = corev1.ResourceList{}
	}
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		delete(out, name)
		if q, ok := old[name]; ok {
			out[name] = q.DeepCopy()
		}
	}
	return out
}

func isRestartable(c *corev1.Container) bool {
	return c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
}

// GetResetFields: a resize never changes the status or the metadata.
func (s resizeStrategy) GetResetFields() map[fieldpath.APIVersion]*fieldpath.Set {
	return statusAndMetadata()
}

// resizeREST serves pods/resize: GET reads the pod, PUT and PATCH resize it.
func resizeREST(store *genericregistry.Store) rest.Storage {
	return podSpecREST(store, resizeStrategy{store.UpdateStrategy.(strategy)})
}
