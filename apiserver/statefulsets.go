package apiserver

import (
	"fmt"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/kubernetes/pkg/apis/apps"
	"k8s.io/kubernetes/pkg/apis/core"
	statefulsetregistry "k8s.io/kubernetes/pkg/registry/apps/statefulset"
)

// StatefulSets (apps/v1) follow Kubernetes' own contract: kube's apps/v1 defaults (podManagementPolicy
// OrderedReady, updateStrategy RollingUpdate with partition 0, revisionHistoryLimit 10,
// persistentVolumeClaimRetentionPolicy Retain/Retain, the pod template's and claim templates' defaults),
// kube's registry strategy (status only through /status with kube's status rules, generation bumped on spec
// changes, maxUnavailable kept while its feature gate, on by default in 1.37, is on) and validation with
// field paths (the immutable fields: selector, serviceName, volumeClaimTemplates, podManagementPolicy...),
// run on kube's internal types through the converting adapter (kubestrategy.go). kube's internal apps types
// are registered in kubeScheme by daemonsets.go. The pod template must also pass Skiff's pod rules, with a
// persistentVolumeClaim volume for each of volumeClaimTemplates, as the controller gives its pods. Kubernetes'
// StatefulSet controller runs them (controller/statefulset.go); /scale is served as for Deployments.

// statefulSetStrategies are kube's StatefulSet strategies: the resource and /status (the controller's
// counts and revisions).
var statefulSetStrategies = &kubeStrategies{
	internal:     func() runtime.Object { return &apps.StatefulSet{} },
	main:         templateLimited{statefulsetregistry.Strategy, statefulSetTemplate},
	subresources: map[string]kubeStrategy{"status": statefulsetregistry.StatusStrategy},
}

// statefulSetTemplate is the pod template Skiff's pod rules check: the pods the controller creates. It gives
// each pod a persistentVolumeClaim volume per volumeClaimTemplate (<claim>-<set>-<ordinal>), which the
// template's mounts may name and which replaces a template volume of the same name.
func statefulSetTemplate(obj runtime.Object) (*core.PodTemplateSpec, string) {
	set := obj.(*apps.StatefulSet)
	template := &set.Spec.Template
	if len(set.Spec.VolumeClaimTemplates) > 0 {
		template = template.DeepCopy()
		// A claim replaces the template's volume of the same name, as the controller does.
		template.Spec.Volumes = slices.DeleteFunc(template.Spec.Volumes, func(v core.Volume) bool {
			return slices.ContainsFunc(set.Spec.VolumeClaimTemplates, func(c core.PersistentVolumeClaim) bool { return c.Name == v.Name })
		})
		for _, claim := range set.Spec.VolumeClaimTemplates {
			template.Spec.Volumes = append(template.Spec.Volumes, core.Volume{Name: claim.Name,
				VolumeSource: core.VolumeSource{PersistentVolumeClaim: &core.PersistentVolumeClaimVolumeSource{ClaimName: claim.Name + "-" + set.Name + "-0"}}})
		}
	}
	return template, "spec.template"
}

// statefulSetColumns are `kubectl get sts`' columns, as kube-apiserver prints them.
var statefulSetColumns = []column{
	nameColumn,
	{name: "Ready", typ: "string", value: func(o runtime.Object) any {
		s := o.(*appsv1.StatefulSet)
		return fmt.Sprintf("%d/%d", s.Status.ReadyReplicas, replicas(s.Spec.Replicas))
	}},
	ageColumn,
	{name: "Containers", typ: "string", priority: 1, value: func(o runtime.Object) any {
		return containerNames(o.(*appsv1.StatefulSet).Spec.Template.Spec.Containers)
	}},
	{name: "Images", typ: "string", priority: 1, value: func(o runtime.Object) any {
		return containerImages(o.(*appsv1.StatefulSet).Spec.Template.Spec.Containers)
	}},
}
