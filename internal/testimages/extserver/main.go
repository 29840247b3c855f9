// Command extserver is an extension API server for Skiff's tests, built with k8s.io/apiserver as any
// aggregated API server is (metrics-server, the conformance suite's sample-apiserver). It serves
// whoami.skiff.dev/v1alpha1, whose one object "me" is the identity the request arrived with. Behind an
// APIService it shows what the aggregator passed on: it authenticates the aggregator's front-proxy client
// certificate and reads the caller from the X-Remote-* headers, trusting the CA and names of
// kube-system/extension-apiserver-authentication, and asks the cluster (SubjectAccessReview) whether the
// caller may, as extension servers do. It serves HTTPS on :8443 with a self-signed certificate.
package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	apiextensionsopenapi "k8s.io/apiextensions-apiserver/pkg/generated/openapi"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	openapinamer "k8s.io/apiserver/pkg/endpoints/openapi"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
	genericapiserver "k8s.io/apiserver/pkg/server"
	genericoptions "k8s.io/apiserver/pkg/server/options"
	basecompatibility "k8s.io/component-base/compatibility"
	"k8s.io/kube-openapi/pkg/common"
	"k8s.io/kube-openapi/pkg/validation/spec"
)

var (
	groupVersion = schema.GroupVersion{Group: "whoami.skiff.dev", Version: "v1alpha1"}
	scheme       = runtime.NewScheme()
	codecs       = serializer.NewCodecFactory(scheme)
)

// WhoAmI is the identity of a request.
type WhoAmI struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	User              string   `json:"user"`
	Groups            []string `json:"groups,omitempty"`
}

// WhoAmIList holds the one WhoAmI.
type WhoAmIList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []WhoAmI `json:"items"`
}

func (w *WhoAmI) DeepCopyObject() runtime.Object {
	out := *w
	w.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	out.Groups = append([]string(nil), w.Groups...)
	return &out
}

func (l *WhoAmIList) DeepCopyObject() runtime.Object {
	out := &WhoAmIList{TypeMeta: l.TypeMeta, ListMeta: *l.ListMeta.DeepCopy()}
	for i := range l.Items {
		out.Items = append(out.Items, *l.Items[i].DeepCopyObject().(*WhoAmI))
	}
	return out
}

func init() {
	// The versioned types are their own internal version: there is nothing to convert.
	for _, gv := range []schema.GroupVersion{groupVersion, {Group: groupVersion.Group, Version: runtime.APIVersionInternal}} {
		scheme.AddKnownTypes(gv, &WhoAmI{}, &WhoAmIList{})
	}
	metav1.AddToGroupVersion(scheme, groupVersion)
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	scheme.AddUnversionedTypes(schema.GroupVersion{Version: "v1"},
		&metav1.Status{}, &metav1.APIVersions{}, &metav1.APIGroupList{}, &metav1.APIGroup{}, &metav1.APIResourceList{})
}

// whoAmIs is the REST storage of whoamis: computed from the request, stored nowhere.
type whoAmIs struct{}

var (
	_ rest.Getter               = whoAmIs{}
	_ rest.Lister               = whoAmIs{}
	_ rest.Scoper               = whoAmIs{}
	_ rest.TableConvertor       = whoAmIs{}
	_ rest.SingularNameProvider = whoAmIs{}
)

func (whoAmIs) New() runtime.Object     { return &WhoAmI{} }
func (whoAmIs) NewList() runtime.Object { return &WhoAmIList{} }
func (whoAmIs) Destroy()                {}
func (whoAmIs) NamespaceScoped() bool   { return false }
func (whoAmIs) GetSingularName() string { return "whoami" }

func me(ctx context.Context) *WhoAmI {
	w := &WhoAmI{ObjectMeta: metav1.ObjectMeta{Name: "me"}}
	if u, ok := genericapirequest.UserFrom(ctx); ok {
		w.User, w.Groups = u.GetName(), u.GetGroups()
	}
	return w
}

func (whoAmIs) Get(ctx context.Context, name string, _ *metav1.GetOptions) (runtime.Object, error) {
	if name != "me" {
		return nil, fmt.Errorf("whoamis %q not found: the only one is \"me\"", name)
	}
	return me(ctx), nil
}

func (whoAmIs) List(ctx context.Context, _ *metainternalversion.ListOptions) (runtime.Object, error) {
	return &WhoAmIList{Items: []WhoAmI{*me(ctx)}}, nil
}

func (whoAmIs) ConvertToTable(_ context.Context, obj runtime.Object, _ runtime.Object) (*metav1.Table, error) {
	table := &metav1.Table{ColumnDefinitions: []metav1.TableColumnDefinition{
		{Name: "Name", Type: "string", Format: "name"}, {Name: "User", Type: "string"}, {Name: "Groups", Type: "string"}}}
	var items []WhoAmI
	switch o := obj.(type) {
	case *WhoAmI:
		items = []WhoAmI{*o}
	case *WhoAmIList:
		items = o.Items
	}
	for i := range items {
		table.Rows = append(table.Rows, metav1.TableRow{Cells: []any{items[i].Name, items[i].User, strings.Join(items[i].Groups, ",")},
			Object: runtime.RawExtension{Object: &items[i]}})
	}
	return table, nil
}

// definitions are the OpenAPI definitions of the served types: metav1's (from apiextensions' generated set,
// which holds them) and WhoAmI's, written out (package main's types are named main.*).
func definitions(ref common.ReferenceCallback) map[string]common.OpenAPIDefinition {
	defs := apiextensionsopenapi.GetOpenAPIDefinitions(ref)
	str := spec.Schema{SchemaProps: spec.SchemaProps{Type: []string{"string"}}}
	objectMeta, listMeta := metav1.ObjectMeta{}.OpenAPIModelName(), metav1.ListMeta{}.OpenAPIModelName()
	meta := func(name string) spec.Schema {
		return spec.Schema{SchemaProps: spec.SchemaProps{Default: map[string]any{}, Ref: ref(name)}}
	}
	defs["main.WhoAmI"] = common.OpenAPIDefinition{
		Schema: spec.Schema{SchemaProps: spec.SchemaProps{Description: "The identity a request arrived with.", Type: []string{"object"},
			Properties: map[string]spec.Schema{"apiVersion": str, "kind": str, "metadata": meta(objectMeta), "user": str,
				"groups": {SchemaProps: spec.SchemaProps{Type: []string{"array"}, Items: &spec.SchemaOrArray{Schema: &str}}}}}},
		Dependencies: []string{objectMeta},
	}
	defs["main.WhoAmIList"] = common.OpenAPIDefinition{
		Schema: spec.Schema{SchemaProps: spec.SchemaProps{Type: []string{"object"}, Required: []string{"items"},
			Properties: map[string]spec.Schema{"apiVersion": str, "kind": str, "metadata": meta(listMeta),
				"items": {SchemaProps: spec.SchemaProps{Type: []string{"array"}, Items: &spec.SchemaOrArray{Schema: &spec.Schema{
					SchemaProps: spec.SchemaProps{Default: map[string]any{}, Ref: ref("main.WhoAmI")}}}}}}}},
		Dependencies: []string{listMeta, "main.WhoAmI"},
	}
	return defs
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "extserver:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	secure := genericoptions.NewSecureServingOptions().WithLoopback()
	secure.BindPort = 8443
	secure.ServerCert.CertDirectory = "" // the self-signed certificate stays in memory: the image has no writable directory to spare
	if err := secure.MaybeDefaultWithSelfSignedCerts("whoami", nil, []net.IP{net.ParseIP("127.0.0.1")}); err != nil {
		return err
	}
	authn := genericoptions.NewDelegatingAuthenticationOptions()
	authz := genericoptions.NewDelegatingAuthorizationOptions()
	cfg := genericapiserver.NewRecommendedConfig(codecs)
	cfg.EffectiveVersion = basecompatibility.NewEffectiveVersionFromString("1.37", "", "")
	// The library builds server-side apply's type converter from the OpenAPI definitions; the aggregator
	// publishes them.
	namer := openapinamer.NewDefinitionNamer(scheme)
	cfg.OpenAPIConfig = genericapiserver.DefaultOpenAPIConfig(definitions, namer)
	cfg.OpenAPIV3Config = genericapiserver.DefaultOpenAPIV3Config(definitions, namer)
	if err := secure.ApplyTo(&cfg.SecureServing, &cfg.LoopbackClientConfig); err != nil {
		return err
	}
	if err := authn.ApplyTo(&cfg.Authentication, cfg.SecureServing, nil); err != nil {
		return err
	}
	if err := authz.ApplyTo(&cfg.Authorization); err != nil {
		return err
	}
	server, err := cfg.Complete().New("whoami", genericapiserver.NewEmptyDelegate())
	if err != nil {
		return err
	}
	group := genericapiserver.NewDefaultAPIGroupInfo(groupVersion.Group, scheme, metav1.ParameterCodec, codecs)
	group.VersionedResourcesStorageMap[groupVersion.Version] = map[string]rest.Storage{"whoamis": whoAmIs{}}
	if err := server.InstallAPIGroup(&group); err != nil {
		return err
	}
	fmt.Println("extserver: serving whoami.skiff.dev/v1alpha1 on :8443")
	return server.PrepareRun().RunWithContext(ctx)
}
