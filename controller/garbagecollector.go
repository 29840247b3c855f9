package controller

import (
	"context"
	"time"

	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/controller-manager/pkg/informerfactory"
	"k8s.io/kubernetes/pkg/controller/garbagecollector"

	"github.com/skiff-dev/skiff/internal/cachetransform"
)

// Kube-controller-manager's defaults: --concurrent-gc-syncs 20, and discovery of the deletable resources
// (new CRDs and aggregated APIs) every 30 s, which is also how long the first sync of the graph may take.
const (
	gcWorkers    = 20
	gcSyncPeriod = 30 * time.Second
)

// buildGarbageCollector builds Kubernetes' own garbage collector, as kube-controller-manager runs it: a
// dependency graph of every object's owner references, kept by an informer per deletable resource (the
// shared typed informers where the manager has them, metadata informers for the rest), from which workers
// delete the objects whose owners are gone, orphan the dependents of an owner deleted with the orphan
// finalizer, and delete those of one deleted in the foreground, blockOwnerDeletion and ownership cycles
// included. Events are not watched (kube's default ignored resources). Being event-driven, it acts as a
// change arrives, however many objects the cluster holds.
func buildGarbageCollector(ctx context.Context, c *Clients) (func(), error) {
	meta := metadatainformer.NewSharedInformerFactoryWithOptions(c.Metadata, 0, metadatainformer.WithTransform(cachetransform.StripManagedFields))
	started := make(chan struct{})
	gc, err := garbagecollector.NewGarbageCollector(ctx, c.Kube, c.Metadata, c.restMapper,
		garbagecollector.DefaultIgnoredResources(), informerfactory.NewInformerFactory(c.Informers, meta), started)
	if err != nil {
		return nil, err
	}
	return func() {
		// The manager has started the shared factory; the graph's monitors start the informers they add to
		// it and to the metadata factory, which is this controller's own.
		close(started)
		go gc.Sync(ctx, c.Discovery, gcSyncPeriod)
		gc.Run(ctx, gcWorkers, gcSyncPeriod)
		meta.Shutdown()
	}, nil
}
