package controller

import (
	"context"
	"time"

	"k8s.io/kubernetes/pkg/controller/certificates/cleaner"
	"k8s.io/utils/clock"
)

// PodCertificateRequests are kept a quarter of an hour, then deleted, issued or not, as kube-controller-manager
// does: every flow completes well within it, and the agent holds the credentials it was issued.
const (
	pcrCleanAfter = 15 * time.Minute
	pcrCleanEvery = 5 * time.Minute
)

// buildPCRCleaner builds Kubernetes' own PodCertificateRequest cleaner (kube-controller-manager's
// podcertificaterequest-cleaner-controller): it deletes requests older than pcrCleanAfter, looking every
// pcrCleanEvery. Agents create one request per podCertificate source of a pod and per refresh.
func buildPCRCleaner(ctx context.Context, c *Clients) (func(), error) {
	return buildPCRCleanerWith(clock.RealClock{})(ctx, c)
}

func buildPCRCleanerWith(clk clock.PassiveClock) buildFunc {
	return func(ctx context.Context, c *Clients) (func(), error) {
		pcrs := c.Informers.Certificates().V1().PodCertificateRequests()
		cl := cleaner.NewPCRCleanerController(c.Kube, pcrs, clk, pcrCleanAfter, pcrCleanEvery)
		return func() { cl.Run(ctx, 1) }, nil
	}
}
