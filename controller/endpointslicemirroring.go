package controller

import (
	"context"

	"k8s.io/kubernetes/pkg/controller/endpointslicemirroring"
)

// kube-controller-manager's defaults for the EndpointSlice mirroring controller.
const (
	mirroringWorkers               = 5
	mirroringMaxEndpointsPerSubset = 1000
)

// buildEndpointSliceMirroring builds Kubernetes' own EndpointSlice mirroring controller: the Endpoints of a
// Service without a selector, which a user or another controller writes by hand, are mirrored into
// EndpointSlices (managed by endpointslicemirroring-controller.k8s.io), so that the service proxy and DNS,
// which read slices only, route to them. Endpoints of Services with a selector are the endpoints
// controller's and are not mirrored.
func buildEndpointSliceMirroring(ctx context.Context, c *Clients) (func(), error) {
	f := c.Informers
	mc := endpointslicemirroring.NewController(ctx, f.Core().V1().Endpoints(), f.Discovery().V1().EndpointSlices(), f.Core().V1().Services(),
		mirroringMaxEndpointsPerSubset, c.Kube, 0)
	return func() { mc.Run(ctx, mirroringWorkers) }, nil
}
