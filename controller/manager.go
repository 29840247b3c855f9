package controller

import (
	"context"
	"sync"

	"github.com/hashicorp/go-hclog"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
)

// Clients are what controllers talk to the API with.
type Clients struct {
	Kube      kubernetes.Interface
	Dynamic   dynamic.Interface
	Metadata  metadata.Interface
	Discovery discovery.DiscoveryInterface
	Informers informers.SharedInformerFactory
	Logger    hclog.Logger
}

// NewClients builds the clients for a rest config.
func NewClients(cfg *rest.Config, logger hclog.Logger) (*Clients, error) {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	meta, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &Clients{Kube: kube, Dynamic: dyn, Metadata: meta, Discovery: kube.Discovery(), Informers: informers.NewSharedInformerFactory(kube, 0), Logger: logger}, nil
}

// controllers is the table of controllers the manager runs.
var controllers = []struct {
	name string
	run  func(ctx context.Context, c *Clients)
}{
	{"namespace", runNamespaceController},
	{"garbage-collector", runGarbageCollector},
	{"serviceaccount", runServiceAccountController},
}

// Run runs every controller until ctx ends (the leader lost its leadership).
func Run(ctx context.Context, c *Clients) {
	var wg sync.WaitGroup
	for _, ctl := range controllers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.Logger.Info("controller starting", "controller", ctl.name)
			ctl.run(ctx, c)
		}()
	}
	c.Informers.Start(ctx.Done())
	wg.Wait()
	c.Informers.Shutdown()
}
