package controller

import (
	"context"

	"k8s.io/kubernetes/pkg/controller/certificates/rootcacertpublisher"
)

// buildRootCACertPublisher builds Kubernetes' own root CA certificate publisher: every namespace holds the
// ConfigMap kube-root-ca.crt with the cluster CA under ca.crt, put back when it is deleted or changed. Pods'
// kube-api-access volumes project it, to verify the API server at kubernetes.default.svc. Without the CA
// (Clients.RootCA) it does not run.
func buildRootCACertPublisher(ctx context.Context, c *Clients) (func(), error) {
	if len(c.RootCA) == 0 {
		c.Logger.Warn("no cluster CA: kube-root-ca.crt is not published")
		return nil, nil
	}
	core := c.Informers.Core().V1()
	publisher, err := rootcacertpublisher.NewPublisher(core.ConfigMaps(), core.Namespaces(), c.Kube, c.RootCA)
	if err != nil {
		return nil, err
	}
	return func() { publisher.Run(ctx, 1) }, nil
}
