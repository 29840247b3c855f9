package apiserver_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilversion "k8s.io/apimachinery/pkg/util/version"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	aggregatorclient "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset"

	"github.com/skiff-dev/skiff/apiserver"
)

// crontabCRD is the CronTab example of the Kubernetes documentation, with what a CRD author uses: a structural
// schema with a pattern, a default and a CEL rule, the status and scale subresources, printer columns, a
// short name and a category.
func crontabCRD() *apiextensionsv1.CustomResourceDefinition {
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "crontabs.stable.example.com"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "stable.example.com", Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "crontabs", Singular: "crontab", Kind: "CronTab",
				ShortNames: []string{"ct"}, Categories: []string{"all"}},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"spec": {Type: "object",
							Properties: map[string]apiextensionsv1.JSONSchemaProps{
								"cronSpec": {Type: "string", Pattern: `^(\d+|\*)(/\d+)?(\s+(\d+|\*)(/\d+)?){4}$`},
								"image":    {Type: "string"},
								"replicas": {Type: "integer", Default: &apiextensionsv1.JSON{Raw: []byte("1")}},
							},
							XValidations: apiextensionsv1.ValidationRules{{Rule: "self.replicas <= 10", Message: "at most 10 replicas"}},
						},
						"status": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{
							"replicas": {Type: "integer"}, "selector": {Type: "string"}}},
					},
				}},
				Subresources: &apiextensionsv1.CustomResourceSubresources{
					Status: &apiextensionsv1.CustomResourceSubresourceStatus{},
					Scale: &apiextensionsv1.CustomResourceSubresourceScale{SpecReplicasPath: ".spec.replicas",
						StatusReplicasPath: ".status.replicas", LabelSelectorPath: ptr(".status.selector")},
				},
				AdditionalPrinterColumns: []apiextensionsv1.CustomResourceColumnDefinition{{Name: "Spec", Type: "string", JSONPath: ".spec.cronSpec"}},
			}},
		},
	}
}

// TestCustomResources: a CRD is served through the whole chain (the extensions server, the built-in kinds'
// server, the aggregator) over the Raft store: Established, in discovery, its objects validated, defaulted,
// pruned, with status and scale, watched, and removed with their CRD; a bad CRD is refused with a field path.
func TestCustomResources(t *testing.T) {
	t.Parallel()
	cfg := apiserver.SharedTestAPI(t)
	ns := apiserver.NamespaceOn(t, cfg, "crs")
	ctx := context.Background()
	crds := apiextensionsclient.NewForConfigOrDie(cfg).ApiextensionsV1().CustomResourceDefinitions()
	dyn := dynamic.NewForConfigOrDie(cfg)
	client := kubernetes.NewForConfigOrDie(cfg)

	created := time.Now()
	if _, err := crds.Create(ctx, crontabCRD(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the CRD Established", 30*time.Second, func() error {
		crd, err := crds.Get(ctx, "crontabs.stable.example.com", metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range crd.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("conditions %v", crd.Status.Conditions)
	})
	t.Logf("Established %v after the create", time.Since(created).Round(time.Millisecond))

	crontabs := dyn.Resource(schema.GroupVersionResource{Group: "stable.example.com", Version: "v1", Resource: "crontabs"}).Namespace(ns)
	var first *unstructured.Unstructured
	waitFor(t, "the first custom resource accepted", 30*time.Second, func() error {
		obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "stable.example.com/v1", "kind": "CronTab",
			"metadata": map[string]any{"name": "nightly", "labels": map[string]any{"team": "a"}},
			"spec":     map[string]any{"cronSpec": "0 3 * * *", "image": "backup:1", "unknown": "pruned"}}}
		var err error
		first, err = crontabs.Create(ctx, obj, metav1.CreateOptions{})
		return err
	})
	t.Logf("first custom resource accepted %v after the CRD's create", time.Since(created).Round(time.Millisecond))
	if got, _, _ := unstructured.NestedInt64(first.Object, "spec", "replicas"); got != 1 {
		t.Errorf("spec.replicas %d; want the default 1", got)
	}
	if _, found, _ := unstructured.NestedString(first.Object, "spec", "unknown"); found {
		t.Error("an unknown field was kept; the schema prunes it")
	}

	// Discovery on every path: the legacy group list (from the aggregator) and the group's resources.
	groups, err := client.Discovery().ServerGroups()
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, g := range groups.Groups {
		found = found || g.Name == "stable.example.com"
	}
	if !found {
		t.Fatalf("stable.example.com missing from /apis")
	}
	resources, err := client.Discovery().ServerResourcesForGroupVersion("stable.example.com/v1")
	if err != nil {
		t.Fatal(err)
	}
	if len(resources.APIResources) == 0 || !strings.Contains(fmt.Sprint(resources.APIResources[0].ShortNames), "ct") {
		t.Fatalf("resources of stable.example.com/v1: %+v", resources.APIResources)
	}

	// Validation: the pattern, the CEL rule, each with its field path; strict field validation.
	bad := []struct {
		name, want string
		spec       map[string]any
	}{
		{"pattern", "spec.cronSpec", map[string]any{"cronSpec": "never"}},
		{"cel", "at most 10 replicas", map[string]any{"cronSpec": "* * * * *", "replicas": int64(11)}},
	}
	for _, tc := range bad {
		obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "stable.example.com/v1", "kind": "CronTab",
			"metadata": map[string]any{"name": "bad-" + tc.name}, "spec": tc.spec}}
		_, err := crontabs.Create(ctx, obj, metav1.CreateOptions{})
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want 422 naming %q", tc.name, err, tc.want)
		}
	}
	strict := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "stable.example.com/v1", "kind": "CronTab",
		"metadata": map[string]any{"name": "strict"}, "spec": map[string]any{"cronSpec": "* * * * *", "colour": "red"}}}
	if _, err := crontabs.Create(ctx, strict, metav1.CreateOptions{FieldValidation: "Strict"}); err == nil || !strings.Contains(err.Error(), "colour") {
		t.Errorf("strict field validation: %v; want a refusal naming the field", err)
	}

	// A watch, then the status and scale subresources.
	w, err := crontabs.Watch(ctx, metav1.ListOptions{ResourceVersion: first.GetResourceVersion()})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	status := first.DeepCopy()
	_ = unstructured.SetNestedField(status.Object, int64(1), "status", "replicas")
	_ = unstructured.SetNestedField(status.Object, "team=a", "status", "selector")
	if _, err := crontabs.UpdateStatus(ctx, status, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := crontabs.Patch(ctx, "nightly", types.MergePatchType, []byte(`{"spec":{"replicas":3}}`), metav1.PatchOptions{}, "scale"); err != nil {
		t.Fatal(err)
	}
	scale, err := crontabs.Get(ctx, "nightly", metav1.GetOptions{}, "scale")
	if err != nil {
		t.Fatal(err)
	}
	if got, _, _ := unstructured.NestedInt64(scale.Object, "spec", "replicas"); got != 3 {
		t.Errorf("scale spec.replicas %d; want 3", got)
	}
	select {
	case ev := <-w.ResultChan():
		if ev.Type != watch.Modified {
			t.Errorf("first watch event %s; want MODIFIED", ev.Type)
		}
	case <-time.After(10 * time.Second):
		t.Error("no watch event for the status update")
	}
	list, err := crontabs.List(ctx, metav1.ListOptions{LabelSelector: "team=a"})
	if err != nil || len(list.Items) != 1 {
		t.Fatalf("list by label: %v, %v", list, err)
	}

	// APIServices: the CRD's group version and every built-in one, Available.
	apiServices := aggregatorclient.NewForConfigOrDie(cfg).ApiregistrationV1().APIServices()
	waitFor(t, "the APIServices Available", 30*time.Second, func() error {
		for _, name := range []string{"v1.stable.example.com", "v1.", "v1.apps", "v1.apiextensions.k8s.io"} {
			s, err := apiServices.Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			available := false
			for _, c := range s.Status.Conditions {
				available = available || c.Type == apiregistrationv1.Available && c.Status == apiregistrationv1.ConditionTrue
			}
			if !available {
				return fmt.Errorf("%s: %v", name, s.Status.Conditions)
			}
		}
		return nil
	})

	// A CRD whose name does not match its group and plural is refused with the field named.
	wrong := crontabCRD()
	wrong.Name = "crontabs.other.example.com"
	if _, err := crds.Create(ctx, wrong, metav1.CreateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "metadata.name") {
		t.Errorf("mismatched name: %v; want 422 naming metadata.name", err)
	}

	// Deleting the CRD deletes its objects first (the library's finalizer), then itself.
	if err := crds.Delete(ctx, "crontabs.stable.example.com", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the CRD gone", 60*time.Second, func() error {
		if _, err := crds.Get(ctx, "crontabs.stable.example.com", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("still there: %v", err)
		}
		return nil
	})
}

// waitFor polls check every 50 ms until it returns nil, failing the test with its last error at the deadline.
func waitFor(t *testing.T, what string, within time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, within, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestVersion: /version says the Kubernetes release the API serves, in the form kubectl and the e2e
// framework parse (semver with Skiff's version as build metadata), not the library's placeholder.
func TestVersion(t *testing.T) {
	t.Parallel()
	cfg := apiserver.SharedTestAPI(t)
	info, err := kubernetes.NewForConfigOrDie(cfg).Discovery().ServerVersion()
	if err != nil {
		t.Fatal(err)
	}
	v, err := utilversion.ParseSemantic(info.GitVersion)
	if err != nil {
		t.Fatalf("gitVersion %q: %v", info.GitVersion, err)
	}
	if v.Major() != 1 || v.Minor() != 37 || !strings.Contains(info.GitVersion, "+skiff.") || info.Major != "1" || info.Minor != "37" {
		t.Fatalf("version %+v; want v1.37.x+skiff.<version>, major 1, minor 37", info)
	}
}

// TestInvalidCRDs: a CRD the library's validation refuses is refused with a 422 naming the field, and a bad
// update leaves the stored CRD as it was. A name already in use by another CRD is not a validation error on
// kube-apiserver either: the CRD is stored with NamesAccepted False and never Established.
func TestInvalidCRDs(t *testing.T) {
	t.Parallel()
	// A server of its own: it creates CRDs under the names TestCustomResources uses.
	cfg := apiserver.StartTestAPI(t, apiserver.TestAPIOptions{})
	ctx := context.Background()
	crds := apiextensionsclient.NewForConfigOrDie(cfg).ApiextensionsV1().CustomResourceDefinitions()

	schema := func(crd *apiextensionsv1.CustomResourceDefinition) *apiextensionsv1.JSONSchemaProps {
		return crd.Spec.Versions[0].Schema.OpenAPIV3Schema
	}
	spec := func(crd *apiextensionsv1.CustomResourceDefinition) apiextensionsv1.JSONSchemaProps {
		return schema(crd).Properties["spec"]
	}
	// The paths are kube-apiserver's: a CRD whose versions share one schema is validated in the internal form
	// that holds it once, at spec.validation.openAPIV3Schema.
	for _, tc := range []struct {
		name   string
		change func(*apiextensionsv1.CustomResourceDefinition)
		want   []string
	}{
		{"non-structural schema", func(crd *apiextensionsv1.CustomResourceDefinition) {
			s := spec(crd)
			s.Type = "" // every node of a structural schema has a type
			schema(crd).Properties["spec"] = s
		}, []string{"spec.validation.openAPIV3Schema.properties[spec].type", "Required value"}},
		{"name that does not match the group", func(crd *apiextensionsv1.CustomResourceDefinition) {
			crd.Name = "crontabs.other.example.com"
		}, []string{"metadata.name", "must be spec.names.plural+\".\"+spec.group"}},
		{"CEL rule that does not compile", func(crd *apiextensionsv1.CustomResourceDefinition) {
			s := spec(crd)
			s.XValidations = apiextensionsv1.ValidationRules{{Rule: "self.replicas <= ", Message: "m"}}
			schema(crd).Properties["spec"] = s
		}, []string{"spec.validation.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule", "compilation failed"}},
		{"CEL rule over its cost budget", func(crd *apiextensionsv1.CustomResourceDefinition) {
			s := spec(crd)
			// Unbounded lists of unbounded strings, compared pairwise by regular expression.
			s.Properties["tags"] = apiextensionsv1.JSONSchemaProps{Type: "array", Items: &apiextensionsv1.JSONSchemaPropsOrArray{
				Schema: &apiextensionsv1.JSONSchemaProps{Type: "string"}}}
			s.XValidations = apiextensionsv1.ValidationRules{{Rule: "self.tags.all(x, self.tags.all(y, x.matches(y)))"}}
			schema(crd).Properties["spec"] = s
		}, []string{"x-kubernetes-validations[0].rule", "cost"}},
		{"default that fails its own schema", func(crd *apiextensionsv1.CustomResourceDefinition) {
			s := spec(crd)
			r := s.Properties["replicas"]
			r.Default = &apiextensionsv1.JSON{Raw: []byte(`"three"`)}
			s.Properties["replicas"] = r
			schema(crd).Properties["spec"] = s
		}, []string{"properties[replicas].default", "Invalid value"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			crd := crontabCRD()
			tc.change(crd)
			_, err := crds.Create(ctx, crd, metav1.CreateOptions{})
			if !apierrors.IsInvalid(err) {
				t.Fatalf("create: %v; want 422 Invalid", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("create: %v\nwant it to name %q", err, w)
				}
			}
		})
	}

	// The same changes as updates of a stored CRD are refused and change nothing.
	stored, err := crds.Create(ctx, crontabCRD(), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the CRD Established", 30*time.Second, func() error {
		crd, err := crds.Get(ctx, stored.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range crd.Status.Conditions {
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				stored = crd
				return nil
			}
		}
		return fmt.Errorf("conditions %v", crd.Status.Conditions)
	})
	update := stored.DeepCopy()
	s := spec(update)
	s.XValidations = apiextensionsv1.ValidationRules{{Rule: "self.nope(", Message: "m"}}
	schema(update).Properties["spec"] = s
	if _, err := crds.Update(ctx, update, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "x-kubernetes-validations[0].rule") {
		t.Errorf("update with a bad rule: %v; want 422 naming the rule", err)
	}
	if after, err := crds.Get(ctx, stored.Name, metav1.GetOptions{}); err != nil || after.ResourceVersion != stored.ResourceVersion {
		t.Errorf("after the refused update: %v, resourceVersion %s, was %s", err, after.ResourceVersion, stored.ResourceVersion)
	}

	// Another CRD claiming the plural's short name "ct" as its own plural in the same group: stored, with
	// NamesAccepted False naming the conflict, and not served.
	clash := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "ct.stable.example.com"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "stable.example.com", Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "ct", Singular: "ctone", Kind: "CronTabTwo"},
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true,
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: ptr(true)}}}},
		},
	}
	if _, err := crds.Create(ctx, clash, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "NamesAccepted False", 30*time.Second, func() error {
		crd, err := crds.Get(ctx, clash.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range crd.Status.Conditions {
			if c.Type == apiextensionsv1.NamesAccepted && c.Status == apiextensionsv1.ConditionFalse && strings.Contains(c.Message, `"ct" is already in use`) {
				return nil
			}
			if c.Type == apiextensionsv1.Established && c.Status == apiextensionsv1.ConditionTrue {
				t.Fatalf("the clashing CRD is Established: %v", crd.Status.Conditions)
			}
		}
		return fmt.Errorf("conditions %v", crd.Status.Conditions)
	})
}
