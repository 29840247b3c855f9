package apiserver

import (
	"context"
	"fmt"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apiserver/pkg/registry/rest"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/kube-openapi/pkg/common"
	"k8s.io/kube-openapi/pkg/validation/spec"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"
)

// The metrics.k8s.io API (kubectl top) is served here rather than by a metrics-server behind an
// APIService: NodeMetrics and PodMetrics, read-only, made on each request from the figures a MetricsSource
// gathered from the node agents. As with metrics-server, the Nodes and Pods come from the API's own
// storage, and each is shown with its metrics if it has any: label and field selectors are the Nodes' and
// Pods', an object without metrics yet is left out of lists and is NotFound on get.

// MetricsSource supplies the latest usage of Nodes and Pods. The objects returned must not be changed by
// the source afterwards (the API copies them before filling in their metadata).
type MetricsSource interface {
	// NodeMetrics returns the usage of the named Node (Timestamp, Window and Usage); false when there is
	// none yet.
	NodeMetrics(name string) (*metricsv1beta1.NodeMetrics, bool)
	// PodMetrics returns the usage of the pod's containers (Timestamp, Window and Containers); false when
	// some container has none yet.
	PodMetrics(namespace, name string) (*metricsv1beta1.PodMetrics, bool)
}

func init() {
	// As every other group: the versioned types are also the group's internal version.
	utilruntime.Must(metricsv1beta1.AddToScheme(Scheme))
	utilruntime.Must(Scheme.SetVersionPriority(metricsv1beta1.SchemeGroupVersion))
	registerAsInternal(metricsv1beta1.SchemeGroupVersion)
}

// objectStore is the registry store of Nodes or Pods, which the metrics resources list.
type objectStore interface {
	rest.Getter
	rest.Lister
}

// metricsAPIGroup builds the metrics.k8s.io group on the stores of Pods and Nodes.
func metricsAPIGroup(source MetricsSource, pods, nodes objectStore) *genericapiserver.APIGroupInfo {
	info := genericapiserver.NewDefaultAPIGroupInfo(metricsv1beta1.GroupName, Scheme, ParameterCodec, Codecs)
	// usage makes the table columns from the figures of one metrics object, shown as kubectl top shows them.
	usage := func(of func(obj runtime.Object) (cpu, memory apiresource.Quantity, window time.Duration)) []column {
		return []column{nameColumn,
			{name: "CPU", typ: "string", value: func(obj runtime.Object) any { cpu, _, _ := of(obj); return fmt.Sprintf("%dm", cpu.MilliValue()) }},
			{name: "Memory", typ: "string", value: func(obj runtime.Object) any { _, mem, _ := of(obj); return fmt.Sprintf("%dMi", mem.Value()>>20) }},
			{name: "Window", typ: "string", value: func(obj runtime.Object) any { _, _, w := of(obj); return w.String() }},
		}
	}
	info.VersionedResourcesStorageMap[metricsv1beta1.SchemeGroupVersion.Version] = map[string]rest.Storage{
		"nodes": &metricsREST{
			resource: "nodes", singular: "node", objects: nodes,
			newFunc: obj[metricsv1beta1.NodeMetrics](), newListFunc: obj[metricsv1beta1.NodeMetricsList](),
			metricsOf: func(o runtime.Object) (runtime.Object, bool) {
				node := o.(*corev1.Node)
				m, ok := source.NodeMetrics(node.Name)
				if !ok {
					return nil, false
				}
				out := m.DeepCopy()
				out.ObjectMeta = metricsMeta(&node.ObjectMeta)
				return out, true
			},
			tableConvertor: tableConvertor{columns: usage(func(o runtime.Object) (apiresource.Quantity, apiresource.Quantity, time.Duration) {
				m := o.(*metricsv1beta1.NodeMetrics)
				return m.Usage[corev1.ResourceCPU], m.Usage[corev1.ResourceMemory], m.Window.Duration
			})},
		},
		"pods": &metricsREST{
			resource: "pods", singular: "pod", namespaced: true, objects: pods,
			newFunc: obj[metricsv1beta1.PodMetrics](), newListFunc: obj[metricsv1beta1.PodMetricsList](),
			metricsOf: func(o runtime.Object) (runtime.Object, bool) {
				pod := o.(*corev1.Pod)
				m, ok := source.PodMetrics(pod.Namespace, pod.Name)
				if !ok {
					return nil, false
				}
				out := m.DeepCopy()
				out.ObjectMeta = metricsMeta(&pod.ObjectMeta)
				return out, true
			},
			tableConvertor: tableConvertor{columns: usage(func(o runtime.Object) (cpu, memory apiresource.Quantity, _ time.Duration) {
				m := o.(*metricsv1beta1.PodMetrics)
				for _, c := range m.Containers {
					cpu.Add(c.Usage[corev1.ResourceCPU])
					memory.Add(c.Usage[corev1.ResourceMemory])
				}
				return cpu, memory, m.Window.Duration
			})},
		},
	}
	return &info
}

// metricsMeta is the metadata of a metrics object: the name, namespace and labels of its Node or Pod, and,
// as metrics-server sets it, the time it was made.
func metricsMeta(m *metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{Name: m.Name, Namespace: m.Namespace, Labels: maps.Clone(m.Labels), CreationTimestamp: metav1.Now()}
}

// metricsREST serves one metrics resource: get and list, nothing else.
type metricsREST struct {
	resource, singular   string
	namespaced           bool
	objects              objectStore // the Nodes or the Pods
	newFunc, newListFunc func() runtime.Object
	// metricsOf returns the metrics object of a Node or Pod, with its metadata; false when there are no
	// metrics yet.
	metricsOf func(obj runtime.Object) (runtime.Object, bool)
	tableConvertor
}

var (
	_ rest.Getter               = &metricsREST{}
	_ rest.Lister               = &metricsREST{}
	_ rest.Scoper               = &metricsREST{}
	_ rest.SingularNameProvider = &metricsREST{}
)

func (r *metricsREST) New() runtime.Object     { return r.newFunc() }
func (r *metricsREST) NewList() runtime.Object { return r.newListFunc() }
func (r *metricsREST) Destroy()                {}
func (r *metricsREST) NamespaceScoped() bool   { return r.namespaced }
func (r *metricsREST) GetSingularName() string { return r.singular }
func (r *metricsREST) groupResource() schema.GroupResource {
	return metricsv1beta1.Resource(r.resource)
}

func (r *metricsREST) Get(ctx context.Context, name string, _ *metav1.GetOptions) (runtime.Object, error) {
	o, err := r.objects.Get(ctx, name, &metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, apierrors.NewNotFound(r.groupResource(), name)
	}
	if err != nil {
		return nil, err
	}
	m, ok := r.metricsOf(o)
	if !ok {
		return nil, apierrors.NewNotFound(r.groupResource(), name)
	}
	return m, nil
}

// List lists the Nodes or Pods with the request's selectors (the handler has already checked that the field
// selector names only metadata.name or metadata.namespace), and returns the metrics of those that have some.
// Resource versions, paging and watch mean nothing for figures that are not stored, and are ignored, as
// metrics-server ignores them.
func (r *metricsREST) List(ctx context.Context, options *metainternalversion.ListOptions) (runtime.Object, error) {
	opts := &metainternalversion.ListOptions{}
	if options != nil {
		opts.LabelSelector, opts.FieldSelector = options.LabelSelector, options.FieldSelector
	}
	list, err := r.objects.List(ctx, opts)
	if err != nil {
		return nil, err
	}
	items, err := meta.ExtractList(list)
	if err != nil {
		return nil, err
	}
	var out []runtime.Object
	for _, item := range items {
		if m, ok := r.metricsOf(item); ok {
			out = append(out, m)
		}
	}
	result := r.newListFunc()
	if err := meta.SetList(result, out); err != nil {
		return nil, err
	}
	return result, nil
}

// withMetricsDefinitions adds the OpenAPI definitions of the metrics.k8s.io types to the generated ones, which
// cover k8s.io/api only: the library builds the server-side apply type converter of each installed group,
// and the published OpenAPI documents, from them.
func withMetricsDefinitions(generated common.GetOpenAPIDefinitions) common.GetOpenAPIDefinitions {
	return func(ref common.ReferenceCallback) map[string]common.OpenAPIDefinition {
		defs := generated(ref)
		maps.Copy(defs, metricsDefinitions(ref))
		return defs
	}
}

// metricsDefinitions describes the five types of k8s.io/metrics/pkg/apis/metrics/v1beta1, as openapi-gen
// would from their comments.
func metricsDefinitions(ref common.ReferenceCallback) map[string]common.OpenAPIDefinition {
	str := func(description string) spec.Schema {
		return spec.Schema{SchemaProps: spec.SchemaProps{Description: description, Type: []string{"string"}}}
	}
	refTo := func(description, name string) spec.Schema {
		return spec.Schema{SchemaProps: spec.SchemaProps{Description: description, Default: map[string]any{}, Ref: ref(name)}}
	}
	resourceList := func(description string) spec.Schema {
		return spec.Schema{SchemaProps: spec.SchemaProps{Description: description, Type: []string{"object"},
			AdditionalProperties: &spec.SchemaOrBool{Allows: true, Schema: &spec.Schema{SchemaProps: spec.SchemaProps{Ref: ref(apiresource.Quantity{}.OpenAPIModelName())}}}}}
	}
	arrayOf := func(description, name string) spec.Schema {
		return spec.Schema{SchemaProps: spec.SchemaProps{Description: description, Type: []string{"array"},
			Items: &spec.SchemaOrArray{Schema: &spec.Schema{SchemaProps: spec.SchemaProps{Default: map[string]any{}, Ref: ref(name)}}}}}
	}
	object := func(description string, props map[string]spec.Schema, required []string, deps ...string) common.OpenAPIDefinition {
		return common.OpenAPIDefinition{
			Schema:       spec.Schema{SchemaProps: spec.SchemaProps{Description: description, Type: []string{"object"}, Properties: props, Required: required}},
			Dependencies: deps,
		}
	}
	typeMeta := func(props map[string]spec.Schema) map[string]spec.Schema {
		props["kind"] = str("Kind is a string value representing the REST resource this object represents.")
		props["apiVersion"] = str("APIVersion defines the versioned schema of this representation of an object.")
		return props
	}
	var (
		objectMeta = metav1.ObjectMeta{}.OpenAPIModelName()
		listMeta   = metav1.ListMeta{}.OpenAPIModelName()
		timeName   = metav1.Time{}.OpenAPIModelName()
		duration   = metav1.Duration{}.OpenAPIModelName()
		quantity   = apiresource.Quantity{}.OpenAPIModelName()
		container  = metricsv1beta1.ContainerMetrics{}.OpenAPIModelName()
		node       = metricsv1beta1.NodeMetrics{}.OpenAPIModelName()
		pod        = metricsv1beta1.PodMetrics{}.OpenAPIModelName()
	)
	const (
		timestamp = "The following fields define time interval from which metrics were collected from the interval [Timestamp-Window, Timestamp]."
		window    = "The length of the interval the usage was measured over."
	)
	return map[string]common.OpenAPIDefinition{
		container: object("ContainerMetrics sets resource usage metrics of a container.", map[string]spec.Schema{
			"name":  str("Container name corresponding to the one from pod.spec.containers."),
			"usage": resourceList("The memory usage is the memory working set."),
		}, []string{"name", "usage"}, quantity),
		node: object("NodeMetrics sets resource usage metrics of a node.", typeMeta(map[string]spec.Schema{
			"metadata":  refTo("Standard object's metadata.", objectMeta),
			"timestamp": refTo(timestamp, timeName),
			"window":    refTo(window, duration),
			"usage":     resourceList("The memory usage is the memory working set."),
		}), []string{"timestamp", "window", "usage"}, objectMeta, timeName, duration, quantity),
		metricsv1beta1.NodeMetricsList{}.OpenAPIModelName(): object("NodeMetricsList is a list of NodeMetrics.", typeMeta(map[string]spec.Schema{
			"metadata": refTo("Standard list metadata.", listMeta),
			"items":    arrayOf("List of node metrics.", node),
		}), []string{"items"}, listMeta, node),
		pod: object("PodMetrics sets resource usage metrics of a pod.", typeMeta(map[string]spec.Schema{
			"metadata":   refTo("Standard object's metadata.", objectMeta),
			"timestamp":  refTo(timestamp, timeName),
			"window":     refTo(window, duration),
			"containers": arrayOf("Metrics for all containers are collected within the same time window.", container),
		}), []string{"timestamp", "window", "containers"}, objectMeta, timeName, duration, container),
		metricsv1beta1.PodMetricsList{}.OpenAPIModelName(): object("PodMetricsList is a list of PodMetrics.", typeMeta(map[string]spec.Schema{
			"metadata": refTo("Standard list metadata.", listMeta),
			"items":    arrayOf("List of pod metrics.", pod),
		}), []string{"items"}, listMeta, pod),
	}
}
