package controller

import (
	"context"

	"k8s.io/kubernetes/pkg/controller/certificates/rootcacertpublisher"
)

// runRootCACertPublisher runs Kubernetes' own root CA certificate publisher: every namespace holds the
// ConfigMap kube-root-ca.crt with the cluster CA under ca.crt, put back when it is deleted or changed. Pods'
// kube-api-access volumes project it, to verify the API server at kubernetes.default.svc. Without the CA
// (Clients.RootCA) it does not run.
func runRootCACertPublisher(ctx context.Context, c *Clients) {
	if len(c.RootCA) == 0 {
		c.Logger.Warn("no cluster CA: kube-root-ca.crt is not published")
		return
	}
	core := c.Informers.Core().V1()
	publisher, err := rootcacertpublisher.NewPublisher(core.ConfigMaps(), core.Namespaces(), c.Kube, c.RootCA)
	if err != nil {
		c.Logger.Error("root CA certificate publisher not started", "error", err)
		return
	}
	// The manager may have started the factory before this controller asked for its informers.
	c.Informers.Start(ctx.Done())
	publisher.Run(ctx, 1)
}
