package controller

import (
	"context"

	"k8s.io/kubernetes/pkg/controller/replication"
)

// replicationWorkers is kube-controller-manager's default (--concurrent-rc-syncs).
const replicationWorkers = 5

// runReplicationManager runs Kubernetes' own replication manager, as kube-controller-manager runs it: it
// keeps spec.replicas pods of each core/v1 ReplicationController running, adopting and releasing pods by
// its label selector, and writes its status (replicas, fullyLabeled, ready, available, observedGeneration,
// the ReplicaFailure condition). It is kube's ReplicaSet controller behind adapters from ReplicaSets to
// ReplicationControllers, all on v1 objects.
func runReplicationManager(ctx context.Context, c *Clients) {
	f := c.Informers
	rm := replication.NewReplicationManager(ctx, f.Core().V1().Pods(), f.Core().V1().ReplicationControllers(), c.Kube, replication.BurstReplicas)
	// The manager may have started the factory before this controller asked for its informers.
	f.Start(ctx.Done())
	rm.Run(ctx, replicationWorkers)
}
