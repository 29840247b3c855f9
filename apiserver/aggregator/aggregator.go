// Package aggregator is the outermost server of the chain: k8s.io/kube-aggregator, which serves the
// apiregistration.k8s.io APIServices, answers /apis discovery for every group, and routes each group version
// either to the local servers behind it (the built-in kinds and the extensions server) or, for an
// APIService backed by a Service, through a proxy to that Service's pods, with the caller's identity in
// front-proxy headers.
//
// kube-apiserver builds this server with CreateAggregatorConfig (which assumes etcd) and
// CreateAggregatorServer (in a package that drags in all of kube-apiserver's admission plugins); here the
// config is built directly over the Raft store, and the registration wiring, a few dozen lines, is Skiff's
// own: a local APIService for each built-in group version the delegate serves and for each CRD version
// (the library's autoregister and kube's crdregistration controllers), and a readiness check that holds until
// they are all Available.
package aggregator

import (
	"fmt"
	"net/http"
	"strings"
	"sync"

	apiextensionsinformers "k8s.io/apiextensions-apiserver/pkg/client/informers/externalversions/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/registry/generic"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/server/healthz"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/apiserver/pkg/storage/value"
	"k8s.io/client-go/tools/cache"
	apiregistrationv1 "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	apiregistrationhelper "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1/helper"
	aggregatorapiserver "k8s.io/kube-aggregator/pkg/apiserver"
	aggregatorscheme "k8s.io/kube-aggregator/pkg/apiserver/scheme"
	apiregistrationclient "k8s.io/kube-aggregator/pkg/client/clientset_generated/clientset/typed/apiregistration/v1"
	apiregistrationinformers "k8s.io/kube-aggregator/pkg/client/informers/externalversions/apiregistration/v1"
	"k8s.io/kube-aggregator/pkg/controllers/autoregister"
	"k8s.io/kubernetes/pkg/controlplane/controller/crdregistration"

	"github.com/skiff-dev/skiff/apiserver/raftstore"
)

// Config is what the aggregator needs beside the chain's shared generic config.
type Config struct {
	// Generic is the chain's generic config; the aggregator works on a shallow copy.
	Generic      *genericapiserver.RecommendedConfig
	Backend      raftstore.Backend
	Transformers value.ResourceTransformers
	// ServiceResolver finds the endpoint of an APIService's Service.
	ServiceResolver aggregatorapiserver.ServiceResolver
	// ProxyTransport, when set, dials the extension API servers (its DialContext is used).
	ProxyTransport *http.Transport
	// ProxyClientCertFile and ProxyClientKeyFile are the front-proxy client certificate the aggregator shows
	// extension API servers, which trust it through the extension-apiserver-authentication ConfigMap.
	ProxyClientCertFile, ProxyClientKeyFile string
	// CRDs is the extensions server's informer of CustomResourceDefinitions: each CRD version gets a local
	// APIService.
	CRDs apiextensionsinformers.CustomResourceDefinitionInformer
	// Priorities order the groups in discovery; a served group version missing here comes last.
	Priorities map[schema.GroupVersion]Priority
}

// Priority orders a group among groups, and a version within its group, in discovery.
type Priority struct{ Group, Version int32 }

// The priority of a served group version missing from Config.Priorities.
const defaultGroupPriority, defaultVersionPriority = 1000, 15

// New builds the aggregator in front of delegate (the built-in kinds' server, which delegates in turn to the
// extensions server).
func New(c Config, delegate genericapiserver.DelegationTarget) (*aggregatorapiserver.APIAggregator, error) {
	generic := *c.Generic
	generic.Config.PostStartHooks = map[string]genericapiserver.PostStartHookConfigEntry{}
	generic.Config.Serializer = aggregatorscheme.Codecs
	// The aggregator serves OpenAPI itself, merging what each server behind it publishes.
	generic.Config.SkipOpenAPIInstallation = true
	generic.Config.MergedResourceConfig = aggregatorapiserver.DefaultAPIResourceConfigSource()
	generic.Config.RESTOptionsGetter = &restOptionsGetter{backend: c.Backend, transformers: c.Transformers}
	cfg := &aggregatorapiserver.Config{
		GenericConfig: &generic,
		ExtraConfig: aggregatorapiserver.ExtraConfig{
			ProxyClientCertFile: c.ProxyClientCertFile, ProxyClientKeyFile: c.ProxyClientKeyFile,
			ServiceResolver: c.ServiceResolver, ProxyTransport: c.ProxyTransport,
			RejectForwardingRedirects: true,
		},
	}
	server, err := cfg.Complete().NewWithDelegate(delegate)
	if err != nil {
		return nil, fmt.Errorf("the aggregator: %w", err)
	}
	if err := register(server, cfg.GenericConfig, delegate, c.CRDs, c.Priorities); err != nil {
		return nil, err
	}
	return server, nil
}

// register keeps a local APIService for every group version the servers behind the aggregator serve: the
// built-in ones once at start (a user may replace one, as metrics.k8s.io with metrics-server), the CRDs'
// continuously. /readyz holds until each built-in one is Available. kube-apiserver's CreateAggregatorServer
// does the same.
func register(server *aggregatorapiserver.APIAggregator, generic *genericapiserver.RecommendedConfig, delegate genericapiserver.DelegationTarget,
	crds apiextensionsinformers.CustomResourceDefinitionInformer, priorities map[schema.GroupVersion]Priority) error {
	client, err := apiregistrationclient.NewForConfig(generic.LoopbackClientConfig)
	if err != nil {
		return err
	}
	apiServices := server.APIRegistrationInformers.Apiregistration().V1().APIServices()
	auto := autoregister.NewAutoRegisterController(apiServices, client)
	var builtIn []*apiregistrationv1.APIService
	for _, gv := range servedGroupVersions(delegate.ListedPaths()) {
		p, ok := priorities[gv]
		if !ok {
			// Every group version the servers behind list is served: one missing from the table comes last
			// rather than not at all (the aggregator routes only group versions with an APIService).
			p = Priority{Group: defaultGroupPriority, Version: defaultVersionPriority}
		}
		s := localAPIService(gv, p)
		auto.AddAPIServiceToSyncOnStart(s)
		builtIn = append(builtIn, s)
	}
	if generic.AggregatedDiscoveryGroupManager != nil {
		for gv, p := range priorities {
			generic.AggregatedDiscoveryGroupManager.SetGroupVersionPriority(metav1.GroupVersion(gv), int(p.Group), int(p.Version))
		}
	}
	crdRegistration := crdregistration.NewCRDRegistrationController(crds, auto)
	if err := server.GenericAPIServer.AddPostStartHook("skiff-apiservice-autoregistration", func(ctx genericapiserver.PostStartHookContext) error {
		go crdRegistration.Run(5, ctx.Done())
		go func() {
			// The CRDs first, so that the autoregister's first sync does not remove the APIServices of CRDs
			// that still exist.
			crdRegistration.WaitForInitialSync()
			auto.Run(5, ctx.Done())
		}()
		return nil
	}); err != nil {
		return err
	}
	return server.GenericAPIServer.AddBootSequenceHealthChecks(availableCheck("autoregister-completion", builtIn, apiServices))
}

// servedGroupVersions reads the group versions a server serves from its listed paths (/api/v1,
// /apis/<group>/<version>).
func servedGroupVersions(paths []string) []schema.GroupVersion {
	var out []schema.GroupVersion
	for _, p := range paths {
		if p == "/api/v1" {
			out = append(out, schema.GroupVersion{Version: "v1"})
			continue
		}
		parts := strings.Split(p, "/")
		if len(parts) == 4 && parts[1] == "apis" {
			out = append(out, schema.GroupVersion{Group: parts[2], Version: parts[3]})
		}
	}
	return out
}

// localAPIService is the APIService of a group version served by the servers behind the aggregator.
func localAPIService(gv schema.GroupVersion, p Priority) *apiregistrationv1.APIService {
	return &apiregistrationv1.APIService{
		ObjectMeta: metav1.ObjectMeta{Name: gv.Version + "." + gv.Group},
		Spec: apiregistrationv1.APIServiceSpec{Group: gv.Group, Version: gv.Version,
			GroupPriorityMinimum: p.Group, VersionPriority: p.Version},
	}
}

// availableCheck is healthy once each of the APIServices has been seen Available.
func availableCheck(name string, apiServices []*apiregistrationv1.APIService, informer apiregistrationinformers.APIServiceInformer) healthz.HealthChecker {
	var mu sync.Mutex
	pending := sets.New[string]()
	for _, s := range apiServices {
		pending.Insert(s.Name)
	}
	seen := func(obj any) {
		s, ok := obj.(*apiregistrationv1.APIService)
		if !ok || !apiregistrationhelper.IsAPIServiceConditionTrue(s, apiregistrationv1.Available) {
			return
		}
		mu.Lock()
		pending.Delete(s.Name)
		mu.Unlock()
	}
	_, _ = informer.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: seen, UpdateFunc: func(_, cur any) { seen(cur) }})
	return healthz.NamedCheck(name, func(*http.Request) error {
		mu.Lock()
		defer mu.Unlock()
		if pending.Len() > 0 {
			return fmt.Errorf("missing APIService: %v", sets.List(pending))
		}
		return nil
	})
}

// restOptionsGetter stores APIServices in the Raft store as apiregistration.k8s.io/v1 JSON, under
// /registry/apiregistration.k8s.io/apiservices/, as kube-apiserver keeps them in etcd.
type restOptionsGetter struct {
	backend      raftstore.Backend
	transformers value.ResourceTransformers
}

func (g *restOptionsGetter) GetRESTOptions(resource schema.GroupResource, _ runtime.Object) (generic.RESTOptions, error) {
	cfg := &storagebackend.ConfigForResource{
		Config: storagebackend.Config{Prefix: "/registry", EventsHistoryWindow: storagebackend.DefaultEventsHistoryWindow,
			Codec: aggregatorscheme.Codecs.LegacyCodec(apiregistrationv1.SchemeGroupVersion)},
		GroupResource: resource,
	}
	if g.transformers != nil {
		cfg.Config.Transformer = g.transformers.TransformerForResource(resource)
	}
	return generic.RESTOptions{
		StorageConfig:           cfg,
		Decorator:               raftstore.Decorator(g.backend, raftstore.CacheOptions{}),
		EnableGarbageCollection: true,
		DeleteCollectionWorkers: 1,
		ResourcePrefix:          "/" + resource.Group + "/" + resource.Resource,
	}, nil
}
