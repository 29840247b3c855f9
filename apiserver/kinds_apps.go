package apiserver

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
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
// and non-negative replicas. The template's pod spec is validated as a pod.
func validateDeployment(o runtime.Object) field.ErrorList {
	d := o.(*appsv1.Deployment)
	spec := field.NewPath("spec")
	var errs field.ErrorList
	if d.Spec.Replicas != nil && *d.Spec.Replicas < 0 {
		errs = append(errs, field.Invalid(spec.Child("replicas"), *d.Spec.Replicas, "must be greater than or equal to 0"))
	}
	errs = append(errs, validateSelectorMatchesTemplate(d.Spec.Selector, d.Spec.Template.Labels, spec)...)
	for _, e := range validatePod(podFromTemplate(&d.Spec.Template)) {
		e.Field = "spec.template." + e.Field
		errs = append(errs, e)
	}
	return errs
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
