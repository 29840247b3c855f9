package apiserver

import (
	"context"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/registry/generic"
	"k8s.io/apiserver/pkg/storage"
	cacherstorage "k8s.io/apiserver/pkg/storage/cacher"
	etcdfeature "k8s.io/apiserver/pkg/storage/feature"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/apiserver/pkg/storage/storagebackend/factory"
	"k8s.io/apiserver/pkg/storage/value"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/skiff-dev/skiff/apiserver/raftstore"
)

// storagePrefix is where every object lives in the store: /registry/<resource>/<namespace>/<name>, the keys
// kube-apiserver uses in etcd (core resources without a group, as kube does).
const storagePrefix = "/registry"

func init() {
	// The watch cache serves consistent reads itself only when the storage can push a progress bookmark on
	// request. The library asks its etcd feature checker, which learns support from an etcd client's version;
	// the Raft store always supports it, so the checker is told so through a client that answers for it.
	etcdfeature.DefaultFeatureSupportChecker.CheckClient(context.Background(), raftStatusClient{}, storage.RequestWatchProgress)
}

// raftStatusClient answers the feature checker's version question for the Raft store: it reports an etcd
// version that has the progress-request fixes the checker looks for.
type raftStatusClient struct{}

func (raftStatusClient) Endpoints() []string { return []string{"skiff-raft-store"} }
func (raftStatusClient) Status(context.Context, string) (*clientv3.StatusResponse, error) {
	return &clientv3.StatusResponse{Version: "3.6.0"}, nil
}

// storedAs is the encode target of a kind stored as another group's type: whatever the object, its stored
// kind.
type storedAs struct{ gvk schema.GroupVersionKind }

func (s storedAs) KindForGroupVersionKinds([]schema.GroupVersionKind) (schema.GroupVersionKind, bool) {
	return s.gvk, true
}
func (s storedAs) Identifier() string { return "stored-as:" + s.gvk.String() }

// restOptionsGetter hands the generic registry its storage: protobuf-encoded objects in the Raft store, under
// the library's watch cache.
type restOptionsGetter struct {
	backend      raftstore.Backend
	eventTTL     time.Duration              // zero: the kind's default
	transformers value.ResourceTransformers // nil: values stored as they are
}

func (g *restOptionsGetter) GetRESTOptions(resource schema.GroupResource, example runtime.Object) (generic.RESTOptions, error) {
	gv, err := storageVersion(resource)
	if err != nil {
		return generic.RESTOptions{}, err
	}
	codec := storageCodec(gv)
	stored := resource // the resource whose keys hold it, which picks its transformer
	for _, k := range kinds {
		if k.gv.Group == resource.Group && k.resource == resource.Resource && k.storageGV != nil {
			stored.Group = k.storageGV.Group
			// Stored as another group's type: encode to that, decode to this group's version.
			info, _ := runtime.SerializerInfoForMediaType(Codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
			codec = Codecs.CodecForVersions(info.Serializer, info.Serializer, storedAs{k.storageGV.WithKind(kindName(k))},
				schema.GroupVersion{Group: resource.Group, Version: runtime.APIVersionInternal})
		}
	}
	cfg := &storagebackend.ConfigForResource{
		Config:        storagebackend.Config{Prefix: storagePrefix, Codec: codec, EventsHistoryWindow: storagebackend.DefaultEventsHistoryWindow},
		GroupResource: resource,
	}
	if g.transformers != nil {
		cfg.Config.Transformer = g.transformers.TransformerForResource(stored)
	}
	return generic.RESTOptions{
		StorageConfig:           cfg,
		Decorator:               g.decorate,
		EnableGarbageCollection: true,
		DeleteCollectionWorkers: 1,
		ResourcePrefix:          resourcePrefix(resource),
	}, nil
}

// resourcePrefix is the key prefix of a resource: "/pods" for the core group, "/deployments.apps"-style
// names are avoided by using the resource alone, as kube-apiserver does for its built-in groups.
func resourcePrefix(gr schema.GroupResource) string { return "/" + gr.Resource }

func storageVersion(gr schema.GroupResource) (schema.GroupVersion, error) {
	for _, g := range servedGroups {
		if g.gv.Group == gr.Group {
			return g.gv, nil
		}
	}
	return schema.GroupVersion{}, fmt.Errorf("no storage version for %s", gr)
}

// storageCodec encodes objects as protobuf in their group's v1, as kube-apiserver stores them, and decodes
// them to the internal version the registry works with.
func storageCodec(gv schema.GroupVersion) runtime.Codec {
	info, ok := runtime.SerializerInfoForMediaType(Codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
	if !ok {
		panic("protobuf serializer missing")
	}
	internal := schema.GroupVersion{Group: gv.Group, Version: runtime.APIVersionInternal}
	return Codecs.CodecForVersions(info.Serializer, info.Serializer, gv, internal)
}

// decorate builds one resource's storage: the Raft store with the library's cacher on top, exactly as
// kube-apiserver puts the cacher on etcd.
func (g *restOptionsGetter) decorate(config *storagebackend.ConfigForResource, prefix string,
	keyFunc func(obj runtime.Object) (string, error), newFunc, newListFunc func() runtime.Object,
	getAttrs storage.AttrFunc, triggers storage.IndexerFuncs, indexers *cache.Indexers) (storage.Interface, factory.DestroyFunc, error) {
	raw := raftstore.New(raftstore.Config{
		Backend: g.backend, Codec: config.Codec, Prefix: config.Prefix, ResourcePrefix: prefix,
		GroupResource: config.GroupResource, NewFunc: newFunc, NewListFunc: newListFunc, Transformer: config.Transformer,
	})
	cacher, err := cacherstorage.NewCacherFromConfig(cacherstorage.Config{
		Storage: raw, Versioner: storage.APIObjectVersioner{}, GroupResource: config.GroupResource,
		EventsHistoryWindow: config.EventsHistoryWindow, ResourcePrefix: prefix, KeyFunc: keyFunc,
		NewFunc: newFunc, NewListFunc: newListFunc, GetAttrsFunc: getAttrs, IndexerFuncs: triggers,
		Indexers: indexers, Codec: config.Codec,
	})
	if err != nil {
		return nil, func() {}, err
	}
	delegator := cacherstorage.NewCacheDelegator(cacher, raw)
	var once sync.Once
	return delegator, func() {
		once.Do(func() {
			delegator.Stop()
			// The library's Cacher.Stop waits for its reflector, which can be blocked for good sending a
			// bookmark to the event channel that the cacher's dispatcher, already stopped, no longer drains
			// (cacher.go processEvent). A stopping server must not hang on it: wait a bounded time.
			stopped := make(chan struct{})
			go func() {
				cacher.Stop()
				close(stopped)
			}()
			select {
			case <-stopped:
			case <-time.After(cacherStopTimeout):
				klog.InfoS("the watch cache did not stop in time; leaving it", "resource", config.GroupResource)
			}
		})
	}, nil
}

// cacherStopTimeout bounds how long a server's shutdown waits for one resource's watch cache.
const cacherStopTimeout = 2 * time.Second
