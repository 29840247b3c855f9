package controller

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/scale"
	"k8s.io/client-go/tools/cache"
	"k8s.io/kubernetes/pkg/controller/disruption"
)

// disruptionWorkers is kube-controller-manager's default for the disruption controller (one worker).
const disruptionWorkers = 1

// runDisruptionController runs Kubernetes' own disruption controller, as kube-controller-manager runs it:
// for each PodDisruptionBudget it counts the healthy (Ready) pods its selector matches, the number it
// needs (minAvailable, or the expected count less maxUnavailable, a percentage of the pods' controllers'
// scale: Deployments, ReplicaSets and StatefulSets from their informers, any other kind through its scale
// subresource) and writes currentHealthy, desiredHealthy, expectedPods, disruptionsAllowed and the
// DisruptionAllowed condition to its status. It also drops from status.disruptedPods the pods the eviction
// subresource recorded once they are deleted (or after two minutes if they never are), and clears a stale
// DisruptionTarget condition from pods that were not deleted after all.
func runDisruptionController(ctx context.Context, c *Clients) {
	f := c.Informers
	// The scale client finds a kind's scale subresource through discovery, as kube-controller-manager's
	// RESTMapper does; the mapper rereads discovery when it meets a kind it does not know.
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(c.Discovery))
	scales, err := scale.NewForConfig(c.config, mapper, dynamic.LegacyAPIPathResolverFunc, scale.NewDiscoveryScaleKindResolver(c.Discovery))
	if err != nil {
		c.Logger.Error("disruption controller not started", "error", err)
		return
	}
	rcs := noReplicationControllers()
	go rcs.informer.Run(ctx.Done())
	dc := disruption.NewDisruptionController(ctx, f.Core().V1().Pods(), f.Policy().V1().PodDisruptionBudgets(), rcs,
		f.Apps().V1().ReplicaSets(), f.Apps().V1().Deployments(), f.Apps().V1().StatefulSets(), c.Kube, mapper, scales, c.Discovery)
	// The manager may have started the factory before this controller asked for its informers.
	f.Start(ctx.Done())
	dc.Run(ctx, disruptionWorkers)
}

// replicationControllers stands in for the ReplicationController informer the disruption controller asks
// for. Skiff serves no ReplicationControllers (the core/v1 kind that ReplicaSets replaced), so no pod can
// have one as its controller; this informer holds none, and lists and watches nothing.
type replicationControllers struct{ informer cache.SharedIndexInformer }

func noReplicationControllers() replicationControllers {
	lw := &emptyListWatch{}
	informer := cache.NewSharedIndexInformer(lw, &corev1.ReplicationController{}, 0,
		cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	return replicationControllers{informer: informer}
}

func (r replicationControllers) Informer() cache.SharedIndexInformer { return r.informer }
func (r replicationControllers) Lister() corelisters.ReplicationControllerLister {
	return corelisters.NewReplicationControllerLister(r.informer.GetIndexer())
}

// emptyListWatch lists no objects and watches for none until stopped.
type emptyListWatch struct{}

func (emptyListWatch) List(metav1.ListOptions) (runtime.Object, error) {
	return &corev1.ReplicationControllerList{ListMeta: metav1.ListMeta{ResourceVersion: "1"}}, nil
}

func (emptyListWatch) Watch(metav1.ListOptions) (watch.Interface, error) { return watch.NewFake(), nil }

// IsWatchListSemanticsUnSupported keeps the reflector on list-then-watch: a streaming list would wait
// for an initial-events bookmark this watch never sends.
func (emptyListWatch) IsWatchListSemanticsUnSupported() bool { return true }
