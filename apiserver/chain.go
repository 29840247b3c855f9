package apiserver

import (
	"net/url"

	autoscalingv2 "k8s.io/api/autoscaling/v2"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsopenapi "k8s.io/apiextensions-apiserver/pkg/generated/openapi"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/authentication/request/headerrequest"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	"k8s.io/apiserver/pkg/util/proxy"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	aggregatoropenapi "k8s.io/kube-aggregator/pkg/generated/openapi"
	"k8s.io/kube-openapi/pkg/common"
	"k8s.io/kubernetes/pkg/controlplane/controller/clusterauthenticationtrust"
	metricsv1beta1 "k8s.io/metrics/pkg/apis/metrics/v1beta1"

	"github.com/skiff-dev/skiff/apiserver/aggregator"
)

// withExtensionDefinitions adds the OpenAPI definitions of the extensions server's and the aggregator's types
// (CustomResourceDefinition, APIService) to Skiff's: the three servers share one set.
func withExtensionDefinitions(skiff common.GetOpenAPIDefinitions) common.GetOpenAPIDefinitions {
	return func(ref common.ReferenceCallback) map[string]common.OpenAPIDefinition {
		defs := skiff(ref)
		for _, more := range []common.GetOpenAPIDefinitions{apiextensionsopenapi.GetOpenAPIDefinitions, aggregatoropenapi.GetOpenAPIDefinitions} {
			for name, def := range more(ref) {
				if _, ok := defs[name]; !ok {
					defs[name] = def
				}
			}
		}
		return defs
	}
}

// apiServicePriorities orders every group version Skiff serves in discovery, with kube-apiserver's figures
// (cmd/kube-apiserver/app/aggregator.go and DefaultGenericAPIServicePriorities); the aggregator registers a
// local APIService for each. metrics.k8s.io has metrics-server's usual priority, so that a user's APIService
// for metrics-server takes the same place.
func apiServicePriorities() map[schema.GroupVersion]aggregator.Priority {
	kube := map[string]aggregator.Priority{
		"": {Group: 18000, Version: 1}, "apps": {Group: 17800, Version: 15}, "events.k8s.io": {Group: 17750, Version: 15},
		"authentication.k8s.io": {Group: 17700, Version: 15}, "authorization.k8s.io": {Group: 17600, Version: 15},
		"autoscaling": {Group: 17500, Version: 15}, "batch": {Group: 17400, Version: 15},
		"certificates.k8s.io": {Group: 17300, Version: 15}, "networking.k8s.io": {Group: 17200, Version: 15},
		"policy": {Group: 17100, Version: 15}, "rbac.authorization.k8s.io": {Group: 17000, Version: 15},
		"storage.k8s.io": {Group: 16800, Version: 15}, "apiextensions.k8s.io": {Group: 16700, Version: 15},
		"admissionregistration.k8s.io": {Group: 16700, Version: 15}, "scheduling.k8s.io": {Group: 16600, Version: 15},
		"coordination.k8s.io": {Group: 16500, Version: 15}, "discovery.k8s.io": {Group: 16200, Version: 15},
		"resource.k8s.io": {Group: 16200, Version: 21}, "flowcontrol.apiserver.k8s.io": {Group: 16100, Version: 21},
		"storagemigration.k8s.io": {Group: 15800, Version: 15},
		metricsv1beta1.GroupName:  {Group: 100, Version: 100},
	}
	// Versions ranked above their group's other versions (kube's version priority 15): the preferred one.
	preferred := map[schema.GroupVersion]int32{autoscalingv2.SchemeGroupVersion: 30}
	out := map[schema.GroupVersion]aggregator.Priority{apiextensionsv1.SchemeGroupVersion: kube[apiextensionsv1.GroupName]}
	for _, g := range servedGroups {
		if p, ok := kube[g.gv.Group]; ok {
			if v, ok := preferred[g.gv]; ok {
				p.Version = v
			}
			out[g.gv] = p
		}
	}
	out[metricsv1beta1.SchemeGroupVersion] = kube[metricsv1beta1.GroupName]
	return out
}

// extensionAuthentication keeps kube-system/extension-apiserver-authentication as kube-apiserver does (kube's
// clusterauthenticationtrust controller): the CA of client certificates, and the front-proxy CA, names and
// headers with which an extension API server behind an APIService recognizes requests the aggregator proxies
// to it, with the caller's identity in X-Remote-* headers.
func extensionAuthentication(clientCAPEM, frontProxyCAPEM []byte, client kubernetes.Interface) (genericapiserver.PostStartHookFunc, error) {
	var info clusterauthenticationtrust.ClusterAuthenticationInfo
	if len(clientCAPEM) > 0 {
		ca, err := dynamiccertificates.NewStaticCAContent("client-ca", clientCAPEM)
		if err != nil {
			return nil, err
		}
		info.ClientCA = ca
	}
	if len(frontProxyCAPEM) > 0 {
		ca, err := dynamiccertificates.NewStaticCAContent("request-header", frontProxyCAPEM)
		if err != nil {
			return nil, err
		}
		info.RequestHeaderCA = ca
		info.RequestHeaderUsernameHeaders = headerrequest.StaticStringSlice{"X-Remote-User"}
		info.RequestHeaderUIDHeaders = headerrequest.StaticStringSlice{"X-Remote-Uid"}
		info.RequestHeaderGroupHeaders = headerrequest.StaticStringSlice{"X-Remote-Group"}
		info.RequestHeaderExtraHeaderPrefixes = headerrequest.StaticStringSlice{"X-Remote-Extra-"}
		info.RequestHeaderAllowedNames = headerrequest.StaticStringSlice{FrontProxyClientName}
	}
	return func(ctx genericapiserver.PostStartHookContext) error {
		go clusterauthenticationtrust.NewClusterAuthenticationTrustController(info, client).Run(ctx, 1)
		return nil
	}, nil
}

// FrontProxyClientName is the common name of the aggregator's front-proxy client certificate, the one name
// extension API servers accept proxied requests from.
const FrontProxyClientName = "front-proxy-client"

// serviceResolver finds a webhook Service's endpoint for the servers: a ready endpoint of the Service's
// port, from the EndpointSlices, as kube-apiserver's endpoint routing does (kube-aggregator's
// NewEndpointServiceResolver). The webhook client still verifies the certificate for <service>.<namespace>.svc.
type serviceResolver struct {
	services corelisters.ServiceLister
	slices   proxy.EndpointSliceGetter
	loopback *url.URL
}

func newServiceResolver(loopback *rest.Config, factory informers.SharedInformerFactory) (*serviceResolver, error) {
	slices, err := proxy.NewEndpointSliceIndexerGetter(factory.Discovery().V1().EndpointSlices())
	if err != nil {
		return nil, err
	}
	host, err := url.Parse(loopback.Host)
	if err != nil {
		return nil, err
	}
	return &serviceResolver{services: factory.Core().V1().Services().Lister(), slices: slices, loopback: host}, nil
}

// ResolveEndpoint is webhook.ServiceResolver.
func (r *serviceResolver) ResolveEndpoint(namespace, name string, port int32) (*url.URL, error) {
	if namespace == "default" && name == "kubernetes" && port == 443 {
		return &url.URL{Scheme: "https", Host: r.loopback.Host}, nil
	}
	return proxy.ResolveEndpoint(r.services, r.slices, namespace, name, port)
}
