package controller

import (
	"context"
	"time"

	"k8s.io/kubernetes/pkg/controller/podautoscaler"
	"k8s.io/kubernetes/pkg/controller/podautoscaler/metrics"
	resourceclient "k8s.io/metrics/pkg/client/clientset/versioned/typed/metrics/v1beta1"
	"k8s.io/metrics/pkg/client/custom_metrics"
	"k8s.io/metrics/pkg/client/external_metrics"
)

// kube-controller-manager's defaults for the horizontal pod autoscaler (--concurrent-horizontal-pod-
// autoscaler-syncs, --horizontal-pod-autoscaler-sync-period, -downscale-stabilization, -tolerance,
// -cpu-initialization-period and -initial-readiness-delay).
const (
	hpaWorkers                 = 5
	hpaSyncPeriod              = 15 * time.Second
	hpaDownscaleStabilization  = 5 * time.Minute
	hpaTolerance               = 0.1
	hpaCPUInitializationPeriod = 5 * time.Minute
	hpaInitialReadinessDelay   = 30 * time.Second
)

// buildHorizontalPodAutoscaler builds Kubernetes' own horizontal pod autoscaler controller, as
// kube-controller-manager runs it (cmd/kube-controller-manager/app/autoscaling.go): every sync period, for
// each autoscaling/v2 HorizontalPodAutoscaler it reads its target's scale subresource (any kind that has
// one: Deployments, ReplicaSets, StatefulSets, ReplicationControllers, custom resources), the metrics of
// the pods the scale's selector matches, computes the replica count the metrics' targets call for within
// minReplicas and maxReplicas, tolerance, behavior and stabilization windows, writes it to the scale, and
// writes the status (current and desired replicas, current metrics, the AbleToScale, ScalingActive and
// ScalingLimited conditions). Resource metrics (CPU, memory) come from the metrics.k8s.io API, which
// Skiff's API serves from its node agents' figures; custom and external metrics from the
// custom.metrics.k8s.io and external.metrics.k8s.io APIs, when an APIService provides them (an HPA using
// them reports ScalingActive False otherwise).
func buildHorizontalPodAutoscaler(ctx context.Context, c *Clients) (func(), error) {
	f := c.Informers
	// The scale client finds a kind's scale subresource through discovery (the shared RESTMapper).
	mapper := c.restMapper
	scales, err := c.scales()
	if err != nil {
		return nil, err
	}
	resources, err := resourceclient.NewForConfig(c.config)
	if err != nil {
		return nil, err
	}
	external, err := external_metrics.NewForConfig(c.config)
	if err != nil {
		return nil, err
	}
	// Which custom metrics API versions are served, reread each sync period.
	apiVersions := custom_metrics.NewAvailableAPIsGetter(c.Discovery)
	client := metrics.NewRESTMetricsClient(resources, custom_metrics.NewForConfig(c.config, mapper, apiVersions), external)
	hpa := podautoscaler.NewHorizontalController(ctx, c.Kube.CoreV1(), scales, c.Kube.AutoscalingV2(), mapper, client,
		f.Autoscaling().V2().HorizontalPodAutoscalers(), f.Core().V1().Pods(),
		hpaSyncPeriod, hpaDownscaleStabilization, hpaTolerance, hpaCPUInitializationPeriod, hpaInitialReadinessDelay)
	return func() {
		go custom_metrics.PeriodicallyInvalidate(apiVersions, hpaSyncPeriod, ctx.Done())
		hpa.Run(ctx, hpaWorkers)
	}, nil
}
