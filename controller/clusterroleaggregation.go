package controller

import (
	"context"

	"k8s.io/kubernetes/pkg/controller/clusterroleaggregation"
)

// buildClusterRoleAggregation builds Kubernetes' own ClusterRole aggregation controller: a ClusterRole with an
// aggregationRule (admin, edit, view among the defaults) holds the rules of every ClusterRole its selectors
// match, kept current as they change.
func buildClusterRoleAggregation(ctx context.Context, c *Clients) (func(), error) {
	ctl := clusterroleaggregation.NewClusterRoleAggregation(c.Informers.Rbac().V1().ClusterRoles(), c.Kube.RbacV1())
	return func() { ctl.Run(ctx, 1) }, nil
}
