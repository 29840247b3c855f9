package controller

import (
	"context"

	"k8s.io/kubernetes/pkg/controller/statefulset"
)

// statefulSetWorkers is kube-controller-manager's default --concurrent-statefulset-syncs.
const statefulSetWorkers = 5

// buildStatefulSetController builds Kubernetes' own StatefulSet controller, as kube-controller-manager runs it:
// pods named <set>-<ordinal> with the hostname <set>-<ordinal> and the subdomain spec.serviceName, created
// one at a time, each Running and Ready before the next (OrderedReady) or all at once (Parallel), removed
// from the highest ordinal down; a pod is replaced under the same name only once the old one is gone;
// RollingUpdate from the highest ordinal down to the partition (maxUnavailable at a time, a beta feature on
// by default in 1.37) and OnDelete; ControllerRevisions of the template for `kubectl rollout history|undo`;
// status for `kubectl rollout status`. A claim per volumeClaimTemplate and ordinal is created
// (<claim>-<set>-<ordinal>) and, by persistentVolumeClaimRetentionPolicy, owned by the set or the pod; the
// agents do not mount such claims yet, so those pods are refused.
func buildStatefulSetController(ctx context.Context, c *Clients) (func(), error) {
	f := c.Informers
	ssc := statefulset.NewStatefulSetController(ctx, f.Core().V1().Pods(), f.Apps().V1().StatefulSets(),
		f.Core().V1().PersistentVolumeClaims(), f.Apps().V1().ControllerRevisions(), c.Kube)
	return func() { ssc.Run(ctx, statefulSetWorkers) }, nil
}
