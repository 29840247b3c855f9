package apiserver

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/registry/generic"
	"k8s.io/apiserver/pkg/storage"
	etcdfeature "k8s.io/apiserver/pkg/storage/feature"
	"k8s.io/apiserver/pkg/storage/storagebackend"
	"k8s.io/apiserver/pkg/storage/value"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/skiff-dev/skiff/apiserver/raftstore"
	"github.com/skiff-dev/skiff/internal/memshare"
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
	shared       *memshare.Registry         // the watch caches' objects, for the server's informers
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
		Decorator:               raftstore.Decorator(g.backend, raftstore.CacheOptions{Shared: g.shared}),
		EnableGarbageCollection: true,
		DeleteCollectionWorkers: 1,
		ResourcePrefix:          resourcePrefix(resource),
	}, nil
}

// resourcePrefix is the key prefix of a resource: "/pods" for the core group, "/deployments.apps"-style
// names are avoided by using the resource alone, as kube-apiserver does for its built-in groups.
func resourcePrefix(gr schema.GroupResource) string { return "/" + gr.Resource }

// storageVersion is the version a group's objects are stored in: its first in servedGroups (v1, or v2 for
// autoscaling, as kube-apiserver stores HorizontalPodAutoscalers).
func storageVersion(gr schema.GroupResource) (schema.GroupVersion, error) {
	for _, g := range servedGroups {
		if g.gv.Group == gr.Group {
			return g.gv, nil
		}
	}
	return schema.GroupVersion{}, fmt.Errorf("no storage version for %s", gr)
}

// storageCodec encodes objects as protobuf in their group's storage version, as kube-apiserver stores them, and decodes
// them to the internal version the registry works with.
func storageCodec(gv schema.GroupVersion) runtime.Codec {
	info, ok := runtime.SerializerInfoForMediaType(Codecs.SupportedMediaTypes(), runtime.ContentTypeProtobuf)
	if !ok {
		panic("protobuf serializer missing")
	}
	internal := schema.GroupVersion{Group: gv.Group, Version: runtime.APIVersionInternal}
	return Codecs.CodecForVersions(info.Serializer, info.Serializer, gv, internal)
}
