package controller

import (
	"context"
	"time"

	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/kubernetes/pkg/controller/daemon"
)

// daemonSetWorkers is kube-controller-manager's default --concurrent-daemonset-syncs.
const daemonSetWorkers = 2

// buildDaemonSetController builds Kubernetes' own DaemonSet controller, as kube-controller-manager runs it: one
// pod per eligible node (the pod's node selector, required node affinity and tolerations judged against each
// Node, with the tolerations Kubernetes adds to daemon pods), each pod pinned to its node by required node
// affinity matchFields on metadata.name and placed by the scheduler; RollingUpdate (maxUnavailable,
// maxSurge) and OnDelete; ControllerRevisions of the template for `kubectl rollout history|undo`; status for
// `kubectl rollout status`. Pods that keep failing on a node are recreated with a backoff of 1 s doubling
// to 15 min.
func buildDaemonSetController(ctx context.Context, c *Clients) (func(), error) {
	f := c.Informers
	dsc, err := daemon.NewDaemonSetsController(ctx, f.Apps().V1().DaemonSets(), f.Apps().V1().ControllerRevisions(),
		f.Core().V1().Pods(), f.Core().V1().Nodes(), c.Kube, flowcontrol.NewBackOff(time.Second, 15*time.Minute))
	if err != nil {
		return nil, err
	}
	return func() { dsc.Run(ctx, daemonSetWorkers) }, nil
}
