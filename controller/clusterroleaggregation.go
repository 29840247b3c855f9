package controller

import (
	"context"

	"k8s.io/kubernetes/pkg/controller/clusterroleaggregation"
)

// runClusterRoleAggregation runs Kubernetes' own ClusterRole aggregation controller: a ClusterRole with an
// aggregationRule (admin, edit, view among the defaults) holds the rules of every ClusterRole its selectors
// match, kept current as they change.
func runClusterRoleAggregation(ctx context.Context, c *Clients) {
	ctl := clusterroleaggregation.NewClusterRoleAggregation(c.Informers.Rbac().V1().ClusterRoles(), c.Kube.RbacV1())
	// The manager may have started the factory before this controller asked for its informer.
	c.Informers.Start(ctx.Done())
	ctl.Run(ctx, 1)
}
