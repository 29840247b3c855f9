package controller

import (
	"context"
	"sync"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
)

// Clients are what controllers talk to the API with.
type Clients struct {
	Kube      kubernetes.Interface
	Dynamic   dynamic.Interface
	Metadata  metadata.Interface
	Discovery discovery.DiscoveryInterface
	Informers informers.SharedInformerFactory
	Recorder  record.EventRecorder
	Logger    hclog.Logger
	// Members is the gossip pool, for the node lifecycle controller; nil turns it off.
	Members       Members
	NodeLifecycle NodeLifecycleConfig

	broadcaster record.EventBroadcaster
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
	broadcaster := record.NewBroadcaster()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events("")})
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "node-controller"})
	return &Clients{Kube: kube, Dynamic: dyn, Metadata: meta, Discovery: kube.Discovery(), Informers: informers.NewSharedInformerFactory(kube, 0),
		Recorder: recorder, Logger: logger, broadcaster: broadcaster}, nil
}

// recorderFor is an event recorder whose events name component as their source, as each of Kubernetes'
// controllers does; without the manager's broadcaster (unit tests) it is the Clients' recorder.
func (c *Clients) recorderFor(component string) record.EventRecorder {
	if c.broadcaster == nil {
		return c.Recorder
	}
	return c.broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: component})
}

// controllers is the table of controllers the manager runs.
var controllers = []struct {
	name string
	run  func(ctx context.Context, c *Clients)
}{
	{"namespace", runNamespaceController},
	{"garbage-collector", runGarbageCollector},
	{"serviceaccount", runServiceAccountController},
	{"node-lifecycle", runNodeLifecycle},
	{"replicaset", runReplicaSetController},
	{"deployment", runDeploymentController},
	{"endpointslice", runEndpointSliceController},
	{"endpoints", runEndpointsController},
}

// podsByNode names the pod informer's index by spec.nodeName.
const podsByNode = "nodeName"

// addSharedIndexers adds the informer indexes controllers share. Indexes cannot be added to an informer that
// has started, and the controllers start concurrently (any of them may start the factory first), so the
// manager adds them before any controller runs.
func addSharedIndexers(f informers.SharedInformerFactory) error {
	return f.Core().V1().Pods().Informer().AddIndexers(cache.Indexers{podsByNode: func(obj any) ([]string, error) {
		return []string{obj.(*corev1.Pod).Spec.NodeName}, nil
	}})
}

// Run runs every controller until ctx ends (the leader lost its leadership).
func Run(ctx context.Context, c *Clients) {
	if err := addSharedIndexers(c.Informers); err != nil {
		c.Logger.Error("informer indexes: controllers not started", "error", err)
		return
	}
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
	c.broadcaster.Shutdown()
}
