// Package extensions serves CustomResourceDefinitions and the custom resources they define: the library
// k8s.io/apiextensions-apiserver, the innermost server of the chain (package apiserver says how a request
// flows), over Skiff's Raft store.
//
// kube-apiserver builds this server's config with CreateAPIExtensionsConfig, which assumes etcd; here it is
// built directly, with two storage hooks over raftstore: one for the CustomResourceDefinition objects (a
// typed codec), and one for custom resources, which the library encodes with a codec of its own per CRD
// version (schema coercion, pruning, defaulting, conversion to the storage version). Both keep the library's
// watch cache on top, as the built-in kinds do. Everything else (validation, CEL, the status and scale
// subresources, conversion webhooks, the CRD controllers, discovery and OpenAPI publishing) is the library's.
package extensions

import (
	"fmt"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apiextensionsapiserver "k8s.io/apiextensions-apiserver/pkg/apiserver"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/registry/generic"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/apiserver/pkg/storage/value"
	"k8s.io/apiserver/pkg/util/webhook"
	"k8s.io/client-go/tools/cache"

	"github.com/skiff-dev/skiff/apiserver/raftstore"
)

// Config is what the extensions server needs beside the chain's shared generic config.
type Config struct {
	// Generic is the chain's generic config; the server works on a shallow copy of it, as kube-apiserver
	// copies its own for apiextensions.
	Generic      *genericapiserver.RecommendedConfig
	Backend      raftstore.Backend
	Transformers value.ResourceTransformers // encryption at rest, by resource; nil stores values as they are
	// ServiceResolver and AuthResolverWrapper reach conversion webhooks, as for admission webhooks.
	ServiceResolver     webhook.ServiceResolver
	AuthResolverWrapper webhook.AuthenticationInfoResolverWrapper
}

// New builds the extensions server in front of delegate (the chain's not-found handler).
func New(c Config, delegate genericapiserver.DelegationTarget) (*apiextensionsapiserver.CustomResourceDefinitions, error) {
	generic := *c.Generic
	generic.Config.PostStartHooks = map[string]genericapiserver.PostStartHookConfigEntry{}
	generic.Config.Serializer = apiextensionsapiserver.Codecs
	generic.Config.MergedResourceConfig = apiextensionsapiserver.DefaultAPIResourceConfigSource()
	generic.Config.RESTOptionsGetter = &restOptionsGetter{backend: c.Backend, transformers: c.Transformers,
		// Stored as v1 JSON: Skiff's store has no objects of an older version to stay compatible with.
		codec: apiextensionsapiserver.Codecs.LegacyCodec(apiextensionsv1.SchemeGroupVersion)}
	cfg := &apiextensionsapiserver.Config{
		GenericConfig: &generic,
		ExtraConfig: apiextensionsapiserver.ExtraConfig{
			CRDRESTOptionsGetter: &restOptionsGetter{backend: c.Backend, transformers: c.Transformers, codec: unstructured.UnstructuredJSONScheme,
				cacheWait: customResourceCacheWait},
			// One: a CRD is Established as soon as its names are accepted. With more, the library holds every
			// new CRD 5 s so that all servers have seen it before clients use it; Skiff's servers see a CRD
			// from the Raft log within milliseconds of each other (docs/extensions.md).
			MasterCount:         1,
			ServiceResolver:     c.ServiceResolver,
			AuthResolverWrapper: c.AuthResolverWrapper,
		},
	}
	// The library's crd-informer-synced hook fails when the server stops before the CRD informer has synced
	// (a server stopped during its bootstrap, before the store answers), and a failed post-start hook is
	// klog.Fatal: the whole process would exit, skipping Skiff's own shutdown (Raft, gossip leave), and
	// every other server of a test process with it. It is replaced by one that holds the same discovery
	// signal (custom resource paths answer 503, not 404, until the informer has synced) and ends quietly.
	disabled := sets.NewString(generic.Config.DisabledPostStartHooks.List()...)
	generic.Config.DisabledPostStartHooks = disabled.Insert(crdInformerSyncedHook)
	server, err := cfg.Complete().New(delegate)
	if err != nil {
		return nil, fmt.Errorf("the extensions server: %w", err)
	}
	delete(server.GenericAPIServer.MuxAndDiscoveryCompleteSignals(), crdInformerSyncedSignal)
	synced := make(chan struct{})
	if err := server.GenericAPIServer.RegisterMuxAndDiscoveryCompleteSignal(crdInformerSyncedSignal, synced); err != nil {
		return nil, err
	}
	informer := server.Informers.Apiextensions().V1().CustomResourceDefinitions().Informer()
	if err := server.GenericAPIServer.AddPostStartHook("skiff-"+crdInformerSyncedHook, func(ctx genericapiserver.PostStartHookContext) error {
		if cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
			close(synced)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	return server, nil
}

// The library's names of the hook and the discovery signal that wait for the CRD informer.
const (
	crdInformerSyncedHook   = "crd-informer-synced"
	crdInformerSyncedSignal = "CRDInformerHasNotSynced"
)

// restOptionsGetter gives a resource of the extensions server its storage in the Raft store, under
// /registry/<group>/<resource>/, the keys kube-apiserver uses for custom resources in etcd.
type restOptionsGetter struct {
	backend      raftstore.Backend
	transformers value.ResourceTransformers
	codec        runtime.Codec
	cacheWait    time.Duration // raftstore.CacheOptions.WaitReady
}

// customResourceCacheWait is how long a server's first request for a custom resource waits for the resource's
// watch cache (raftstore.CacheOptions.WaitReady).
const customResourceCacheWait = 5 * time.Second

func (g *restOptionsGetter) GetRESTOptions(resource schema.GroupResource, _ runtime.Object) (generic.RESTOptions, error) {
	cfg := &storagebackend.ConfigForResource{
		Config:        storagebackend.Config{Prefix: "/registry", Codec: g.codec, EventsHistoryWindow: storagebackend.DefaultEventsHistoryWindow},
		GroupResource: resource,
	}
	if g.transformers != nil {
		cfg.Config.Transformer = g.transformers.TransformerForResource(resource)
	}
	return generic.RESTOptions{
		StorageConfig:           cfg,
		Decorator:               raftstore.Decorator(g.backend, raftstore.CacheOptions{WaitReady: g.cacheWait}),
		EnableGarbageCollection: true,
		DeleteCollectionWorkers: 1,
		ResourcePrefix:          "/" + resource.Group + "/" + resource.Resource,
	}, nil
}
