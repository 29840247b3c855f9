package controller

import (
	"context"

	"k8s.io/kubernetes/pkg/controller/disruption"
)

// disruptionWorkers is kube-controller-manager's default for the disruption controller (one worker).
const disruptionWorkers = 1

// buildDisruptionController builds Kubernetes' own disruption controller, as kube-controller-manager runs it:
// for each PodDisruptionBudget it counts the healthy (Ready) pods its selector matches, the number it
// needs (minAvailable, or the expected count less maxUnavailable, a percentage of the pods' controllers'
// scale: Deployments, ReplicaSets, ReplicationControllers and StatefulSets from their informers, any other
// kind through its scale subresource) and writes currentHealthy, desiredHealthy, expectedPods, disruptionsAllowed and the
// DisruptionAllowed condition to its status. It also drops from status.disruptedPods the pods the eviction
// subresource recorded once they are deleted (or after two minutes if they never are), and clears a stale
// DisruptionTarget condition from pods that were not deleted after all.
func buildDisruptionController(ctx context.Context, c *Clients) (func(), error) {
	f := c.Informers
	// The scale client finds a kind's scale subresource through discovery (the shared RESTMapper).
	scales, err := c.scales()
	if err != nil {
		return nil, err
	}
	dc := disruption.NewDisruptionController(ctx, f.Core().V1().Pods(), f.Policy().V1().PodDisruptionBudgets(),
		f.Core().V1().ReplicationControllers(), f.Apps().V1().ReplicaSets(), f.Apps().V1().Deployments(), f.Apps().V1().StatefulSets(),
		c.Kube, c.restMapper, scales, c.Discovery)
	return func() { dc.Run(ctx, disruptionWorkers) }, nil
}
