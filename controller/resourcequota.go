package controller

import (
	"cmp"
	"context"
	"time"

	"k8s.io/apiserver/pkg/quota/v1/generic"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/controller-manager/pkg/informerfactory"
	kubecontroller "k8s.io/kubernetes/pkg/controller"
	"k8s.io/kubernetes/pkg/controller/resourcequota"
	quotainstall "k8s.io/kubernetes/pkg/quota/v1/install"

	"github.com/skiff-dev/skiff/internal/cachetransform"
	"github.com/skiff-dev/skiff/internal/quotaconfig"
)

// Kube-controller-manager's defaults: --resource-quota-sync-period 5m, --concurrent-resource-quota-syncs 5,
// and the discovery of quotable resources every 30 s.
const (
	quotaSyncPeriod      = 5 * time.Minute
	quotaWorkers         = 5
	quotaDiscoveryPeriod = 30 * time.Second
)

// buildResourceQuotaController builds Kubernetes' own resource quota controller, as kube-controller-manager runs
// it: it recomputes each ResourceQuota's status.used (and status.hard) from the objects that exist, when a
// quota changes, when an object it counts goes away, and every five minutes, so that what a refused or failed
// create charged at admission is given back. It counts with the evaluators the API's admission uses
// (internal/quotaconfig), and count/<resource>.<group> of every other namespaced kind through
// metadata informers.
func buildResourceQuotaController(ctx context.Context, c *Clients) (func(), error) {
	f := c.Informers
	meta := metadatainformer.NewSharedInformerFactoryWithOptions(c.Metadata, 0, metadatainformer.WithTransform(cachetransform.StripManagedFields))
	objectOrMetadata := informerfactory.NewInformerFactory(f, meta)
	config, err := quotaconfig.New(f, generic.ListerFuncForResourceFunc(objectOrMetadata.ForResource))
	if err != nil {
		return nil, err
	}
	started := make(chan struct{})
	discovery := c.Discovery.ServerPreferredNamespacedResources
	ctl, err := resourcequota.NewController(ctx, &resourcequota.ControllerOptions{
		QuotaClient:           c.Kube.CoreV1(),
		ResourceQuotaInformer: f.Core().V1().ResourceQuotas(),
		ResyncPeriod:          kubecontroller.StaticResyncPeriodFunc(cmp.Or(c.QuotaSyncPeriod, quotaSyncPeriod)),
		InformerFactory:       objectOrMetadata,
		// The shared informers run without resync; a period here would only be refused, with a warning each.
		ReplenishmentResyncPeriod: kubecontroller.StaticResyncPeriodFunc(0),
		DiscoveryFunc:             discovery,
		IgnoredResourcesFunc:      config.IgnoredResources,
		InformersStarted:          started,
		Registry:                  generic.NewRegistry(config.Evaluators()),
		UpdateFilter:              quotainstall.DefaultUpdateFilter(),
	})
	if err != nil {
		return nil, err
	}
	return func() {
		// The manager has started the shared factory; the metadata informers for other kinds are this
		// controller's own.
		meta.Start(ctx.Done())
		close(started)
		go ctl.Sync(ctx, discovery, quotaDiscoveryPeriod)
		ctl.Run(ctx, quotaWorkers)
		meta.Shutdown()
	}, nil
}
