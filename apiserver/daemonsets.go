package apiserver

import (
	"fmt"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/kubernetes/pkg/apis/apps"
	kubeappsv1 "k8s.io/kubernetes/pkg/apis/apps/v1"
	"k8s.io/kubernetes/pkg/apis/core"
	controllerrevisionregistry "k8s.io/kubernetes/pkg/registry/apps/controllerrevision"
	daemonsetregistry "k8s.io/kubernetes/pkg/registry/apps/daemonset"
)

// DaemonSets and ControllerRevisions (apps/v1) follow Kubernetes' own contract: kube's apps/v1 defaulting
// (updateStrategy RollingUpdate with maxUnavailable 1 and maxSurge 0, revisionHistoryLimit 10, the pod
// template's defaults), kube's registry strategies (status only through /status, templateGeneration and
// generation bumped on a template change) and validation, run on kube's internal types through the
// converting adapter (kubestrategy.go). On top of kube's validation, a DaemonSet's pod template must hold
// only what Skiff's agents run (the rule Deployments have), so a DaemonSet whose pods would be refused is
// itself refused with 422.

func init() {
	// kube's internal apps types, the v1 ones, and kube's conversions and v1 defaults between them.
	utilruntime.Must(apps.AddToScheme(kubeScheme))
	utilruntime.Must(kubeappsv1.AddToScheme(kubeScheme))
}

// daemonSetStrategies are kube's DaemonSet strategies: the resource and /status (the controller's counts).
var daemonSetStrategies = &kubeStrategies{
	internal: func() runtime.Object { return &apps.DaemonSet{} },
	main: templateLimited{fullKubeStrategy: daemonsetregistry.Strategy, template: func(obj runtime.Object) (*core.PodTemplateSpec, string) {
		return &obj.(*apps.DaemonSet).Spec.Template, "spec.template"
	}},
	subresources: map[string]kubeStrategy{"status": daemonsetregistry.StatusStrategy},
}

// controllerRevisionStrategies are kube's ControllerRevision strategy: data required, immutable but for
// the revision number.
var controllerRevisionStrategies = &kubeStrategies{
	internal: func() runtime.Object { return &apps.ControllerRevision{} },
	main:     controllerrevisionregistry.Strategy,
}

// daemonSetColumns are `kubectl get ds`'s columns, as kube-apiserver prints them.
var daemonSetColumns = []column{
	nameColumn,
	{name: "Desired", typ: "integer", value: func(o runtime.Object) any { return int64(o.(*appsv1.DaemonSet).Status.DesiredNumberScheduled) }},
	{name: "Current", typ: "integer", value: func(o runtime.Object) any { return int64(o.(*appsv1.DaemonSet).Status.CurrentNumberScheduled) }},
	{name: "Ready", typ: "integer", value: func(o runtime.Object) any { return int64(o.(*appsv1.DaemonSet).Status.NumberReady) }},
	{name: "Up-to-date", typ: "integer", value: func(o runtime.Object) any { return int64(o.(*appsv1.DaemonSet).Status.UpdatedNumberScheduled) }},
	{name: "Available", typ: "integer", value: func(o runtime.Object) any { return int64(o.(*appsv1.DaemonSet).Status.NumberAvailable) }},
	{name: "Node Selector", typ: "string", value: func(o runtime.Object) any {
		return labelsOrNone(o.(*appsv1.DaemonSet).Spec.Template.Spec.NodeSelector)
	}},
	ageColumn,
	{name: "Containers", typ: "string", priority: 1, value: func(o runtime.Object) any {
		return containerNames(o.(*appsv1.DaemonSet).Spec.Template.Spec.Containers)
	}},
	{name: "Images", typ: "string", priority: 1, value: func(o runtime.Object) any {
		return containerImages(o.(*appsv1.DaemonSet).Spec.Template.Spec.Containers)
	}},
	{name: "Selector", typ: "string", priority: 1, value: func(o runtime.Object) any {
		return metav1.FormatLabelSelector(o.(*appsv1.DaemonSet).Spec.Selector)
	}},
}

// controllerRevisionColumns are `kubectl get controllerrevisions`' columns: the controller as
// kind.group/name, and the revision number.
var controllerRevisionColumns = []column{
	nameColumn,
	{name: "Controller", typ: "string", value: func(o runtime.Object) any {
		ref := metav1.GetControllerOf(o.(*appsv1.ControllerRevision))
		if ref == nil {
			return "<none>"
		}
		kind := strings.ToLower(ref.Kind)
		if gv, err := schema.ParseGroupVersion(ref.APIVersion); err == nil && gv.Group != "" {
			kind += "." + gv.Group
		}
		return kind + "/" + ref.Name
	}},
	{name: "Revision", typ: "integer", value: func(o runtime.Object) any { return o.(*appsv1.ControllerRevision).Revision }},
	ageColumn,
}

func labelsOrNone(m map[string]string) string {
	if len(m) == 0 {
		return "<none>"
	}
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%s=%s", k, v))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

func containerNames(cs []corev1.Container) string {
	var names []string
	for _, c := range cs {
		names = append(names, c.Name)
	}
	return strings.Join(names, ",")
}

func containerImages(cs []corev1.Container) string {
	var images []string
	for _, c := range cs {
		images = append(images, c.Image)
	}
	return strings.Join(images, ",")
}
