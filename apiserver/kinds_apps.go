package apiserver

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

func defaultDeployment(o runtime.Object) {
	d := o.(*appsv1.Deployment)
	if d.Spec.Replicas == nil {
		one := int32(1)
		d.Spec.Replicas = &one
	}
	if d.Spec.Strategy.Type == "" {
		d.Spec.Strategy.Type = appsv1.RollingUpdateDeploymentStrategyType
	}
	if d.Spec.Strategy.Type == appsv1.RollingUpdateDeploymentStrategyType && d.Spec.Strategy.RollingUpdate == nil {
		quarter := intstr.FromString("25%")
		d.Spec.Strategy.RollingUpdate = &appsv1.RollingUpdateDeployment{MaxUnavailable: &quarter, MaxSurge: &quarter}
	}
	if d.Spec.RevisionHistoryLimit == nil {
		ten := int32(10)
		d.Spec.RevisionHistoryLimit = &ten
	}
	if d.Spec.ProgressDeadlineSeconds == nil {
		deadline := int32(600)
		d.Spec.ProgressDeadlineSeconds = &deadline
	}
	pod := podFromTemplate(&d.Spec.Template)
	defaultPod(pod)
	d.Spec.Template.Spec = pod.Spec
}

func defaultReplicaSet(o runtime.Object) {
	rs := o.(*appsv1.ReplicaSet)
	if rs.Spec.Replicas == nil {
		one := int32(1)
		rs.Spec.Replicas = &one
	}
	pod := podFromTemplate(&rs.Spec.Template)
	defaultPod(pod)
	rs.Spec.Template.Spec = pod.Spec
}

// validateDeployment checks what the controllers depend on: a selector that matches the template's labels,
// non-negative counts, and a template that is a valid pod that restarts always.
func validateDeployment(o runtime.Object) field.ErrorList {
	d := o.(*appsv1.Deployment)
	return validateWorkload(d.Spec.Replicas, d.Spec.MinReadySeconds, d.Spec.Selector, &d.Spec.Template)
}

// validateReplicaSet is validateDeployment's rule for ReplicaSets.
func validateReplicaSet(o runtime.Object) field.ErrorList {
	rs := o.(*appsv1.ReplicaSet)
	return validateWorkload(rs.Spec.Replicas, rs.Spec.MinReadySeconds, rs.Spec.Selector, &rs.Spec.Template)
}

// validateWorkload is the rule apps/v1 has for the kinds that keep a number of pods from a template.
func validateWorkload(replicas *int32, minReadySeconds int32, selector *metav1.LabelSelector, template *corev1.PodTemplateSpec) field.ErrorList {
	spec := field.NewPath("spec")
	var errs field.ErrorList
	if replicas != nil && *replicas < 0 {
		errs = append(errs, field.Invalid(spec.Child("replicas"), *replicas, "must be greater than or equal to 0"))
	}
	if minReadySeconds < 0 {
		errs = append(errs, field.Invalid(spec.Child("minReadySeconds"), minReadySeconds, "must be greater than or equal to 0"))
	}
	errs = append(errs, validateSelectorMatchesTemplate(selector, template.Labels, spec)...)
	if policy := template.Spec.RestartPolicy; policy != corev1.RestartPolicyAlways {
		errs = append(errs, field.NotSupported(spec.Child("template", "spec", "restartPolicy"), policy, []corev1.RestartPolicy{corev1.RestartPolicyAlways}))
	}
	for _, e := range validatePod(podFromTemplate(template)) {
		e.Field = "spec.template." + e.Field
		errs = append(errs, e)
	}
	return errs
}

// validateSelectorUnchanged is apps/v1's rule that a workload's selector is immutable: pods already made
// would silently change owner.
func validateSelectorUnchanged(o, old runtime.Object) field.ErrorList {
	selector := func(o runtime.Object) *metav1.LabelSelector {
		switch w := o.(type) {
		case *appsv1.Deployment:
			return w.Spec.Selector
		case *appsv1.ReplicaSet:
			return w.Spec.Selector
		}
		return nil
	}
	if now := selector(o); !apiequality.Semantic.DeepEqual(now, selector(old)) {
		return field.ErrorList{field.Invalid(field.NewPath("spec", "selector"), now, "field is immutable")}
	}
	return nil
}

func validateSelectorMatchesTemplate(sel *metav1.LabelSelector, templateLabels map[string]string, spec *field.Path) field.ErrorList {
	if sel == nil || (len(sel.MatchLabels) == 0 && len(sel.MatchExpressions) == 0) {
		return field.ErrorList{field.Required(spec.Child("selector"), "")}
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return field.ErrorList{field.Invalid(spec.Child("selector"), sel, err.Error())}
	}
	if !s.Matches(labels.Set(templateLabels)) {
		return field.ErrorList{field.Invalid(spec.Child("template", "metadata", "labels"), templateLabels, "`selector` does not match template `labels`")}
	}
	return nil
}

var deploymentColumns = []column{
	nameColumn,
	{name: "Ready", typ: "string", value: func(o runtime.Object) interface{} {
		d := o.(*appsv1.Deployment)
		return fmt.Sprintf("%d/%d", d.Status.ReadyReplicas, replicas(d.Spec.Replicas))
	}},
	{name: "Up-to-date", typ: "integer", value: func(o runtime.Object) interface{} { return int64(o.(*appsv1.Deployment).Status.UpdatedReplicas) }},
	{name: "Available", typ: "integer", value: func(o runtime.Object) interface{} { return int64(o.(*appsv1.Deployment).Status.AvailableReplicas) }},
	ageColumn,
}

var replicaSetColumns = []column{
	nameColumn,
	{name: "Desired", typ: "integer", value: func(o runtime.Object) interface{} { return int64(replicas(o.(*appsv1.ReplicaSet).Spec.Replicas)) }},
	{name: "Current", typ: "integer", value: func(o runtime.Object) interface{} { return int64(o.(*appsv1.ReplicaSet).Status.Replicas) }},
	{name: "Ready", typ: "integer", value: func(o runtime.Object) interface{} { return int64(o.(*appsv1.ReplicaSet).Status.ReadyReplicas) }},
	ageColumn,
}

func replicas(r *int32) int32 {
	if r == nil {
		return 1
	}
	return *r
}

func leaseHolder(o runtime.Object) interface{} {
	if h := o.(*coordinationv1.Lease).Spec.HolderIdentity; h != nil {
		return *h
	}
	return "<none>"
}
