package controller

import (
	"context"

	"k8s.io/kubernetes/pkg/controller/servicecidrs"
)

// serviceCIDRWorkers is kube-controller-manager's default.
const serviceCIDRWorkers = 5

// buildServiceCIDRController builds Kubernetes' own ServiceCIDR controller: it marks each ServiceCIDR Ready
// (the API allocates ClusterIPs from Ready ones only), puts its finalizer on it, and lets a ServiceCIDR being
// deleted go only once no Service holds an address that it alone covers (a Warning event says which).
func buildServiceCIDRController(ctx context.Context, c *Clients) (func(), error) {
	f := c.Informers
	sc := servicecidrs.NewController(ctx, f.Networking().V1().ServiceCIDRs(), f.Networking().V1().IPAddresses(), c.Kube)
	return func() { sc.Run(ctx, serviceCIDRWorkers) }, nil
}
