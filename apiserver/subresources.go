package apiserver

import (
	"context"
	"fmt"
	"net/http"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/apiserver/pkg/storage"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
)

// subresource builds an extra subresource of a kind from its main store.
type subresource struct {
	name  string
	build func(store *genericregistry.Store) rest.Storage
}

// Pods: graceful deletion.

// podGracefulDelete decides a pod's grace period as Kubernetes does: the request's value, else the pod's
// terminationGracePeriodSeconds; zero (removed at once) for a pod not bound to a node or already finished.
func podGracefulDelete(obj runtime.Object, options *metav1.DeleteOptions) bool {
	pod := obj.(*corev1.Pod)
	var period int64
	if options.GracePeriodSeconds != nil {
		period = *options.GracePeriodSeconds
	} else if pod.Spec.TerminationGracePeriodSeconds != nil {
		period = *pod.Spec.TerminationGracePeriodSeconds
	}
	if pod.Spec.NodeName == "" || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		period = 0
	}
	if period < 0 {
		period = 1
	}
	options.GracePeriodSeconds = &period
	return true
}

// Pods: binding. The scheduler binds a pod to a node by creating a Binding.

type bindingREST struct{ store *genericregistry.Store }

func (r *bindingREST) New() runtime.Object { return &corev1.Binding{} }
func (r *bindingREST) Destroy()            {}

func (r *bindingREST) Create(ctx context.Context, name string, obj runtime.Object, createValidation rest.ValidateObjectFunc, options *metav1.CreateOptions) (runtime.Object, error) {
	binding := obj.(*corev1.Binding)
	if binding.Name != name {
		return nil, apierrors.NewBadRequest("name in URL does not match name in Binding object")
	}
	if binding.Target.Kind != "" && binding.Target.Kind != "Node" {
		return nil, apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Binding").GroupKind(), name,
			field.ErrorList{field.NotSupported(field.NewPath("target", "kind"), binding.Target.Kind, []string{"Node"})})
	}
	if binding.Target.Name == "" {
		return nil, apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Binding").GroupKind(), name,
			field.ErrorList{field.Required(field.NewPath("target", "name"), "")})
	}
	if createValidation != nil {
		if err := createValidation(ctx, obj); err != nil {
			return nil, err
		}
	}
	key, err := r.store.KeyFunc(ctx, name)
	if err != nil {
		return nil, err
	}
	dryRun := options != nil && len(options.DryRun) > 0
	err = r.store.Storage.GuaranteedUpdate(ctx, key, &corev1.Pod{}, false, nil, storage.SimpleUpdate(func(o runtime.Object) (runtime.Object, error) {
		pod := o.(*corev1.Pod)
		if pod.DeletionTimestamp != nil {
			return nil, apierrors.NewConflict(corev1.Resource("pods/binding"), name, fmt.Errorf("pod %s is being deleted, cannot be assigned to a host", name))
		}
		if pod.Spec.NodeName != "" {
			return nil, apierrors.NewConflict(corev1.Resource("pods/binding"), name, fmt.Errorf("pod %s is already assigned to node %q", name, pod.Spec.NodeName))
		}
		if binding.UID != "" && binding.UID != pod.UID {
			return nil, apierrors.NewConflict(corev1.Resource("pods/binding"), name, fmt.Errorf("pod UID %s does not match binding UID %s", pod.UID, binding.UID))
		}
		pod.Spec.NodeName = binding.Target.Name
		for k, v := range binding.Annotations {
			if pod.Annotations == nil {
				pod.Annotations = map[string]string{}
			}
			pod.Annotations[k] = v
		}
		setPodCondition(&pod.Status, corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()})
		return pod, nil
	}), dryRun, nil)
	if err != nil {
		return nil, err
	}
	return &metav1.Status{Status: metav1.StatusSuccess, Code: http.StatusCreated}, nil
}

func setPodCondition(status *corev1.PodStatus, c corev1.PodCondition) {
	for i := range status.Conditions {
		if status.Conditions[i].Type == c.Type {
			status.Conditions[i] = c
			return
		}
	}
	status.Conditions = append(status.Conditions, c)
}

// Pods: ephemeralcontainers. Only spec.ephemeralContainers changes, and only by additions.

type ephemeralStrategy struct{ strategy }

func (s ephemeralStrategy) PrepareForUpdate(ctx context.Context, obj, old runtime.Object) {
	pod, oldPod := obj.(*corev1.Pod), old.(*corev1.Pod)
	added := pod.Spec.EphemeralContainers
	*pod = *oldPod.DeepCopy()
	pod.Spec.EphemeralContainers = added
	// An ephemeral container is a change of the pod's spec: kube-apiserver bumps metadata.generation for it.
	if !apiequality.Semantic.DeepEqual(added, oldPod.Spec.EphemeralContainers) {
		pod.Generation = oldPod.Generation + 1
	}
	for i := range pod.Spec.EphemeralContainers {
		c := &pod.Spec.EphemeralContainers[i]
		if c.ImagePullPolicy == "" {
			c.ImagePullPolicy = corev1.PullIfNotPresent
		}
		if c.TerminationMessagePath == "" {
			c.TerminationMessagePath = corev1.TerminationMessagePathDefault
		}
		if c.TerminationMessagePolicy == "" {
			c.TerminationMessagePolicy = corev1.TerminationMessageReadFile
		}
	}
}

func (s ephemeralStrategy) ValidateUpdate(ctx context.Context, obj, old runtime.Object) field.ErrorList {
	pod, oldPod := obj.(*corev1.Pod), old.(*corev1.Pod)
	path := field.NewPath("spec", "ephemeralContainers")
	var errs field.ErrorList
	if len(pod.Spec.EphemeralContainers) < len(oldPod.Spec.EphemeralContainers) {
		return field.ErrorList{field.Forbidden(path, "existing ephemeral containers may not be removed")}
	}
	names := map[string]bool{}
	for _, c := range pod.Spec.Containers {
		names[c.Name] = true
	}
	for _, c := range pod.Spec.InitContainers {
		names[c.Name] = true
	}
	for i, c := range pod.Spec.EphemeralContainers {
		p := path.Index(i)
		if i < len(oldPod.Spec.EphemeralContainers) {
			if !apiequality.Semantic.DeepEqual(c, oldPod.Spec.EphemeralContainers[i]) {
				errs = append(errs, field.Forbidden(p, "existing ephemeral containers may not be changed"))
			}
		}
		for _, msg := range validation.IsDNS1123Label(c.Name) {
			errs = append(errs, field.Invalid(p.Child("name"), c.Name, msg))
		}
		if names[c.Name] {
			errs = append(errs, field.Duplicate(p.Child("name"), c.Name))
		}
		names[c.Name] = true
		if c.Image == "" {
			errs = append(errs, field.Required(p.Child("image"), ""))
		}
		if i >= len(oldPod.Spec.EphemeralContainers) {
			errs = append(errs, validateNewEphemeral(p, &c, pod)...)
		}
	}
	return errs
}

// validateNewEphemeral refuses, as Kubernetes does, what an ephemeral container may not have: it gets no
// guaranteed resources, no ports, probes, lifecycle or restart policy, and may only target a container of
// the pod.
func validateNewEphemeral(p *field.Path, c *corev1.EphemeralContainer, pod *corev1.Pod) field.ErrorList {
	var errs field.ErrorList
	for _, f := range []struct {
		name string
		set  bool
	}{
		{"ports", len(c.Ports) > 0}, {"lifecycle", c.Lifecycle != nil}, {"livenessProbe", c.LivenessProbe != nil},
		{"readinessProbe", c.ReadinessProbe != nil}, {"startupProbe", c.StartupProbe != nil},
		{"resources", len(c.Resources.Limits) > 0 || len(c.Resources.Requests) > 0 || len(c.Resources.Claims) > 0},
		{"resizePolicy", len(c.ResizePolicy) > 0}, {"restartPolicy", c.RestartPolicy != nil},
		{"restartPolicyRules", len(c.RestartPolicyRules) > 0},
	} {
		if f.set {
			errs = append(errs, field.Forbidden(p.Child(f.name), "cannot be set for an Ephemeral Container"))
		}
	}
	if t := c.TargetContainerName; t != "" {
		found := false
		for _, list := range [][]corev1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
			for _, other := range list {
				found = found || other.Name == t
			}
		}
		if !found {
			errs = append(errs, field.NotFound(p.Child("targetContainerName"), t))
		}
	}
	return errs
}

// GetResetFields: adding an ephemeral container never changes the status or the metadata.
func (s ephemeralStrategy) GetResetFields() map[fieldpath.APIVersion]*fieldpath.Set {
	return statusAndMetadata()
}

func statusAndMetadata() map[fieldpath.APIVersion]*fieldpath.Set {
	return map[fieldpath.APIVersion]*fieldpath.Set{
		"v1": fieldpath.NewSet(fieldpath.MakePathOrDie("status"), fieldpath.MakePathOrDie("metadata")),
	}
}

// podSpecStrategy is the strategy of a subresource that changes one part of a pod's spec.
type podSpecStrategy interface {
	rest.RESTUpdateStrategy
	rest.ResetFieldsStrategy
}

// podSpecREST serves such a subresource: GET reads the pod, PUT and PATCH change it through st.
func podSpecREST(store *genericregistry.Store, st podSpecStrategy) rest.Storage {
	e := *store
	e.CreateStrategy = nil
	e.DeleteStrategy = nil
	e.UpdateStrategy = st
	e.ResetFieldsStrategy = st
	return &statusREST{store: &e}
}

func ephemeralContainersREST(store *genericregistry.Store) rest.Storage {
	return podSpecREST(store, ephemeralStrategy{store.UpdateStrategy.(strategy)})
}

var podSubresources = []subresource{
	{"ephemeralcontainers", ephemeralContainersREST},
	{"resize", resizeREST},
	{"binding", func(s *genericregistry.Store) rest.Storage { return &bindingREST{store: s} }},
	{"eviction", func(s *genericregistry.Store) rest.Storage { return &evictionREST{store: s} }},
}

// Scale, for the workload kinds: kubectl scale reads and writes replicas through it.

type scaleAccess struct {
	get func(obj runtime.Object) (spec, status int32, selector string)
	set func(obj runtime.Object, replicas int32)
}

type scaleREST struct {
	store  *genericregistry.Store
	access scaleAccess
}

func (r *scaleREST) New() runtime.Object { return &autoscalingv1.Scale{} }
func (r *scaleREST) Destroy()            {}

func (r *scaleREST) toScale(obj runtime.Object) *autoscalingv1.Scale {
	m, _ := obj.(metav1.Object)
	spec, status, selector := r.access.get(obj)
	return &autoscalingv1.Scale{
		ObjectMeta: metav1.ObjectMeta{Name: m.GetName(), Namespace: m.GetNamespace(), UID: m.GetUID(),
			ResourceVersion: m.GetResourceVersion(), CreationTimestamp: m.GetCreationTimestamp()},
		Spec:   autoscalingv1.ScaleSpec{Replicas: spec},
		Status: autoscalingv1.ScaleStatus{Replicas: status, Selector: selector},
	}
}

func (r *scaleREST) Get(ctx context.Context, name string, options *metav1.GetOptions) (runtime.Object, error) {
	obj, err := r.store.Get(ctx, name, options)
	if err != nil {
		return nil, err
	}
	return r.toScale(obj), nil
}

func (r *scaleREST) Update(ctx context.Context, name string, objInfo rest.UpdatedObjectInfo, createValidation rest.ValidateObjectFunc,
	updateValidation rest.ValidateObjectUpdateFunc, forceAllowCreate bool, options *metav1.UpdateOptions) (runtime.Object, bool, error) {
	obj, _, err := r.store.Update(ctx, name, &scaleUpdate{r: r, inner: objInfo}, nil, func(ctx context.Context, obj, old runtime.Object) error {
		if updateValidation == nil {
			return nil
		}
		return updateValidation(ctx, r.toScale(obj), r.toScale(old))
	}, false, options)
	if err != nil {
		return nil, false, err
	}
	return r.toScale(obj), false, nil
}

// scaleUpdate applies a new Scale to the stored workload.
type scaleUpdate struct {
	r     *scaleREST
	inner rest.UpdatedObjectInfo
}

func (u *scaleUpdate) Preconditions() *metav1.Preconditions { return u.inner.Preconditions() }

func (u *scaleUpdate) UpdatedObject(ctx context.Context, old runtime.Object) (runtime.Object, error) {
	oldScale := u.r.toScale(old)
	obj, err := u.inner.UpdatedObject(ctx, oldScale)
	if err != nil {
		return nil, err
	}
	scale, ok := obj.(*autoscalingv1.Scale)
	if !ok {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("expected a Scale, got %T", obj))
	}
	if scale.Spec.Replicas < 0 {
		return nil, apierrors.NewInvalid(autoscalingv1.SchemeGroupVersion.WithKind("Scale").GroupKind(), scale.Name,
			field.ErrorList{field.Invalid(field.NewPath("spec", "replicas"), scale.Spec.Replicas, "must be greater than or equal to 0")})
	}
	if scale.ResourceVersion != "" && scale.ResourceVersion != oldScale.ResourceVersion {
		return nil, apierrors.NewConflict(u.r.store.DefaultQualifiedResource, scale.Name, fmt.Errorf("the object has been modified; please apply your changes to the latest version and try again"))
	}
	updated := old.DeepCopyObject()
	u.r.access.set(updated, scale.Spec.Replicas)
	return updated, nil
}

func selectorString(sel *metav1.LabelSelector) string {
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return ""
	}
	return s.String()
}

var deploymentScale = scaleAccess{
	get: func(o runtime.Object) (int32, int32, string) {
		d := o.(*appsv1.Deployment)
		return replicas(d.Spec.Replicas), d.Status.Replicas, selectorString(d.Spec.Selector)
	},
	set: func(o runtime.Object, n int32) { o.(*appsv1.Deployment).Spec.Replicas = &n },
}

var replicaSetScale = scaleAccess{
	get: func(o runtime.Object) (int32, int32, string) {
		rs := o.(*appsv1.ReplicaSet)
		return replicas(rs.Spec.Replicas), rs.Status.Replicas, selectorString(rs.Spec.Selector)
	},
	set: func(o runtime.Object, n int32) { o.(*appsv1.ReplicaSet).Spec.Replicas = &n },
}

var statefulSetScale = scaleAccess{
	get: func(o runtime.Object) (int32, int32, string) {
		s := o.(*appsv1.StatefulSet)
		return replicas(s.Spec.Replicas), s.Status.Replicas, selectorString(s.Spec.Selector)
	},
	set: func(o runtime.Object, n int32) { o.(*appsv1.StatefulSet).Spec.Replicas = &n },
}

// replicationControllerScale is a ReplicationController's: its selector is a map of labels.
var replicationControllerScale = scaleAccess{
	get: func(o runtime.Object) (int32, int32, string) {
		rc := o.(*corev1.ReplicationController)
		return replicas(rc.Spec.Replicas), rc.Status.Replicas, labels.SelectorFromSet(rc.Spec.Selector).String()
	},
	set: func(o runtime.Object, n int32) { o.(*corev1.ReplicationController).Spec.Replicas = &n },
}

func scaleSubresource(access scaleAccess) []subresource {
	return []subresource{{"scale", func(s *genericregistry.Store) rest.Storage { return &scaleREST{store: s, access: access} }}}
}

// GroupVersionKind tells the installer that scale takes an autoscaling/v1 Scale.
func (r *scaleREST) GroupVersionKind(schema.GroupVersion) schema.GroupVersionKind {
	return autoscalingv1.SchemeGroupVersion.WithKind("Scale")
}
