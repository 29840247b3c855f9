package chaos

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Resource is what the traffic writes and the watchers watch: objects that each hold one string value.
type Resource int

const (
	// ConfigMaps: the value is the data under trafficDataKey.
	ConfigMaps Resource = iota
	// CustomResources: objects of the suite's own CustomResourceDefinition (customCRD), whose value is
	// data.v, so that custom resources take the same traffic and the same checks as the built-in kinds.
	CustomResources
)

func (r Resource) String() string {
	if r == CustomResources {
		return customPlural + "." + customGroup
	}
	return "configmaps"
}

// The suite's CustomResourceDefinition.
const (
	customGroup  = "chaos.skiff.dev"
	customPlural = "chaostraffics"
)

var customGVR = schema.GroupVersionResource{Group: customGroup, Version: "v1", Resource: customPlural}

func customCRD() *apiextensionsv1.CustomResourceDefinition {
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: customPlural + "." + customGroup},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: customGroup, Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: customPlural, Singular: "chaostraffic", Kind: "ChaosTraffic"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"data": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{trafficDataKey: {Type: "string"}}},
					}}}}},
		},
	}
}

// ensureCustomCRD creates the suite's CRD if it is missing and waits until it is Established.
func ensureCustomCRD(ctx context.Context, cfg *rest.Config) error {
	crds, err := apiextensionsclient.NewForConfig(cfg)
	if err != nil {
		return err
	}
	client := crds.ApiextensionsV1().CustomResourceDefinitions()
	if _, err := client.Create(ctx, customCRD(), metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	for {
		crd, err := client.Get(ctx, customCRD().Name, metav1.GetOptions{})
		if err == nil {
			for _, c := range crd.Status.Conditions {
				if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the CRD %s not Established: %w (last error: %v)", customCRD().Name, ctx.Err(), err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// objects reads and writes the resource's objects of one namespace through one server.
type objects interface {
	create(ctx context.Context, name, value string) (rv int64, got string, err error)
	update(ctx context.Context, name, value string, rv int64) (int64, string, error)
	delete(ctx context.Context, name string, rv int64) error
	get(ctx context.Context, name string) (int64, string, error)
	// list returns the list's resourceVersion and each object's name, value and resourceVersion.
	list(ctx context.Context) (int64, []Item, error)
	watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	// event reads a watch event's object: its name, value and resourceVersion.
	event(ev watch.Event) (name, value string, rv int64, err error)
}

// objectsFor builds the resource's objects of namespace through the server that cfg and httpClient reach.
func (r Resource) objectsFor(cfg *rest.Config, httpClient *http.Client, namespace string) (objects, error) {
	if r == CustomResources {
		dyn, err := dynamic.NewForConfigAndClient(cfg, httpClient)
		if err != nil {
			return nil, err
		}
		return customObjects{dyn.Resource(customGVR).Namespace(namespace)}, nil
	}
	client, err := kubernetes.NewForConfigAndClient(cfg, httpClient)
	if err != nil {
		return nil, err
	}
	return configMapObjects{client.CoreV1().ConfigMaps(namespace)}, nil
}

type configMapObjects struct {
	c interface {
		Create(ctx context.Context, cm *corev1.ConfigMap, opts metav1.CreateOptions) (*corev1.ConfigMap, error)
		Update(ctx context.Context, cm *corev1.ConfigMap, opts metav1.UpdateOptions) (*corev1.ConfigMap, error)
		Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
		Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.ConfigMap, error)
		List(ctx context.Context, opts metav1.ListOptions) (*corev1.ConfigMapList, error)
		Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	}
}

func configMapAnswer(cm *corev1.ConfigMap, err error) (int64, string, error) {
	if err != nil {
		return 0, "", err
	}
	rv, err := parseRV(cm.ResourceVersion)
	return rv, configMapValue(cm), err
}

func (o configMapObjects) create(ctx context.Context, name, value string) (int64, string, error) {
	return configMapAnswer(o.c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: map[string]string{trafficDataKey: value}}, metav1.CreateOptions{}))
}

func (o configMapObjects) update(ctx context.Context, name, value string, rv int64) (int64, string, error) {
	return configMapAnswer(o.c.Update(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: strconv.FormatInt(rv, 10)},
		Data: map[string]string{trafficDataKey: value}}, metav1.UpdateOptions{}))
}

func (o configMapObjects) delete(ctx context.Context, name string, rv int64) error {
	s := strconv.FormatInt(rv, 10)
	return o.c.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &s}})
}

func (o configMapObjects) get(ctx context.Context, name string) (int64, string, error) {
	return configMapAnswer(o.c.Get(ctx, name, metav1.GetOptions{}))
}

func (o configMapObjects) list(ctx context.Context) (int64, []Item, error) {
	list, err := o.c.List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, nil, err
	}
	rv, err := parseRV(list.ResourceVersion)
	if err != nil {
		return 0, nil, fmt.Errorf("list: %w", err)
	}
	items := make([]Item, 0, len(list.Items))
	for i := range list.Items {
		irv, err := parseRV(list.Items[i].ResourceVersion)
		if err != nil {
			return 0, nil, fmt.Errorf("list item %s: %w", list.Items[i].Name, err)
		}
		items = append(items, Item{Key: list.Items[i].Name, Value: configMapValue(&list.Items[i]), RV: irv})
	}
	return rv, items, nil
}

func (o configMapObjects) watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	return o.c.Watch(ctx, opts)
}

func (configMapObjects) event(ev watch.Event) (string, string, int64, error) {
	cm, ok := ev.Object.(*corev1.ConfigMap)
	if !ok {
		return "", "", 0, fmt.Errorf("a %s event carries a %T, not a ConfigMap", ev.Type, ev.Object)
	}
	rv, err := parseRV(cm.ResourceVersion)
	return cm.Name, configMapValue(cm), rv, err
}

type customObjects struct{ c dynamic.ResourceInterface }

func customObject(name, value string, rv int64) *unstructured.Unstructured {
	obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": customGroup + "/v1", "kind": "ChaosTraffic",
		"metadata": map[string]any{"name": name}, "data": map[string]any{trafficDataKey: value}}}
	if rv > 0 {
		obj.SetResourceVersion(strconv.FormatInt(rv, 10))
	}
	return obj
}

// customValue is the value of a custom object: data.v, or "{}" when it has none.
func customValue(obj *unstructured.Unstructured) string {
	if v, ok, _ := unstructured.NestedString(obj.Object, "data", trafficDataKey); ok {
		return v
	}
	return "{}"
}

func customAnswer(obj *unstructured.Unstructured, err error) (int64, string, error) {
	if err != nil {
		return 0, "", err
	}
	rv, err := parseRV(obj.GetResourceVersion())
	return rv, customValue(obj), err
}

func (o customObjects) create(ctx context.Context, name, value string) (int64, string, error) {
	return customAnswer(o.c.Create(ctx, customObject(name, value, 0), metav1.CreateOptions{}))
}

func (o customObjects) update(ctx context.Context, name, value string, rv int64) (int64, string, error) {
	return customAnswer(o.c.Update(ctx, customObject(name, value, rv), metav1.UpdateOptions{}))
}

func (o customObjects) delete(ctx context.Context, name string, rv int64) error {
	s := strconv.FormatInt(rv, 10)
	return o.c.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &s}})
}

func (o customObjects) get(ctx context.Context, name string) (int64, string, error) {
	return customAnswer(o.c.Get(ctx, name, metav1.GetOptions{}))
}

func (o customObjects) list(ctx context.Context) (int64, []Item, error) {
	list, err := o.c.List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, nil, err
	}
	rv, err := parseRV(list.GetResourceVersion())
	if err != nil {
		return 0, nil, fmt.Errorf("list: %w", err)
	}
	items := make([]Item, 0, len(list.Items))
	for i := range list.Items {
		irv, err := parseRV(list.Items[i].GetResourceVersion())
		if err != nil {
			return 0, nil, fmt.Errorf("list item %s: %w", list.Items[i].GetName(), err)
		}
		items = append(items, Item{Key: list.Items[i].GetName(), Value: customValue(&list.Items[i]), RV: irv})
	}
	return rv, items, nil
}

func (o customObjects) watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	return o.c.Watch(ctx, opts)
}

func (customObjects) event(ev watch.Event) (string, string, int64, error) {
	obj, ok := ev.Object.(*unstructured.Unstructured)
	if !ok {
		return "", "", 0, fmt.Errorf("a %s event carries a %T, not a custom object", ev.Type, ev.Object)
	}
	rv, err := parseRV(obj.GetResourceVersion())
	return obj.GetName(), customValue(obj), rv, err
}
