package controller

import (
	"context"

	"k8s.io/kubernetes/pkg/controller/replication"
)

// replicationWorkers is kube-controller-manager's default (--concurrent-rc-syncs).
const replicationWorkers = 5

// buildReplicationManager builds Kubernetes' own replication manager, as kube-controller-manager runs it: it
// keeps spec.replicas pods of each core/v1 ReplicationController running, adopting and releasing pods by
// its label selector, and writes its status (replicas, fullyLabeled, ready, available, observedGeneration,
// the ReplicaFailure condition). It is kube's ReplicaSet controller behind adapters from ReplicaSets to
// ReplicationControllers, all on v1 objects.
func buildReplicationManager(ctx context.Context, c *Clients) (func(), error) {
	f := c.Informers
	rm := replication.NewReplicationManager(ctx, f.Core().V1().Pods(), f.Core().V1().ReplicationControllers(), c.Kube, replication.BurstReplicas)
	return func() { rm.Run(ctx, replicationWorkers) }, nil
}
