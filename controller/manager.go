package controller

import (
	"context"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/scale"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	kubecontroller "k8s.io/kubernetes/pkg/controller"
	"k8s.io/kubernetes/pkg/controller/history"
	volumecommon "k8s.io/kubernetes/pkg/controller/volume/common"

	"github.com/skiff-dev/skiff/internal/cachetransform"
)

// Clients are what controllers talk to the API with.
type Clients struct {
	Kube      kubernetes.Interface
	Dynamic   dynamic.Interface
	Metadata  metadata.Interface
	Discovery discovery.DiscoveryInterface
	Informers informers.SharedInformerFactory
	// InformersStarted, when set, is called once the manager has built every controller and started
	// Informers (or has given up building them): other services sharing the factory start it only after.
	InformersStarted func()
	Recorder         record.EventRecorder
	Logger           hclog.Logger
	// Members is the gossip pool, for the node lifecycle controller; nil turns it off.
	Members       Members
	NodeLifecycle NodeLifecycleConfig
	// QuotaSyncPeriod is how often the resource quota controller recomputes every quota (0: five minutes).
	QuotaSyncPeriod time.Duration
	// CertificateSigning is the CA the certificate controllers sign with.
	CertificateSigning CertificateSigning
	// LoadBalancer is where LoadBalancer Services get their addresses; no pools: nowhere.
	LoadBalancer LoadBalancerConfig
	// RootCA is the cluster CA certificate (PEM), which the root CA publisher puts in every namespace as
	// kube-root-ca.crt for pods to verify the API with.
	RootCA []byte
	// ConfigFor, when set, gives the configuration each controller acts with: that of its service account in
	// kube-system (Kubernetes' names, so the bootstrap RBAC policy bounds it), as kube-controller-manager
	// does with --use-service-account-credentials. The shared informers keep the manager's own identity.
	ConfigFor func(serviceAccount string) (*rest.Config, error)

	broadcaster record.EventBroadcaster
	// config is the rest config the clients act with, for clients a controller builds itself (scale).
	config *rest.Config
	// restMapper resolves kinds and resources through discovery for the controllers that meet any kind (scale
	// targets, migrations). Run forgets what it learnt every 30 s, as kube-controller-manager does with its
	// shared mapper: a memory-cached discovery never looks again by itself, so a kind served later (a new
	// CRD) would stay unknown.
	restMapper meta.ResettableRESTMapper
}

// scales is a scale client over the shared RESTMapper, for controllers that read and write any kind's scale.
func (c *Clients) scales() (scale.ScalesGetter, error) {
	return scale.NewForConfig(c.config, c.restMapper, dynamic.LegacyAPIPathResolverFunc, scale.NewDiscoveryScaleKindResolver(c.Discovery))
}

// NewClients builds the clients for a rest config.
func NewClients(cfg *rest.Config, logger hclog.Logger) (*Clients, error) {
	c := &Clients{Logger: logger}
	if err := c.connect(cfg); err != nil {
		return nil, err
	}
	c.Informers = informers.NewSharedInformerFactoryWithOptions(c.Kube, 0, informers.WithTransform(cachetransform.StripManagedFields))
	return c, nil
}

// connect sets the clients, the event broadcaster and the recorder that act through cfg.
func (c *Clients) connect(cfg *rest.Config) error {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	meta, err := metadata.NewForConfig(cfg)
	if err != nil {
		return err
	}
	broadcaster := record.NewBroadcaster()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events("")})
	c.Kube, c.Dynamic, c.Metadata, c.Discovery = kube, dyn, meta, kube.Discovery()
	c.config = cfg
	c.broadcaster = broadcaster
	c.Recorder = broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "node-controller"})
	return nil
}

func (c *Clients) informersStarted() {
	if c.InformersStarted != nil {
		c.InformersStarted()
	}
}

// actingAs is a copy of the clients that acts as a controller's service account, sharing the informers.
func (c *Clients) actingAs(serviceAccount string) (*Clients, error) {
	if c.ConfigFor == nil {
		return c, nil
	}
	cfg, err := c.ConfigFor(serviceAccount)
	if err != nil {
		return nil, err
	}
	own := *c
	if err := own.connect(cfg); err != nil {
		return nil, err
	}
	return &own, nil
}

// recorderFor is an event recorder whose events name component as their source, as each of Kubernetes'
// controllers does; without the manager's broadcaster (unit tests) it is the Clients' recorder.
func (c *Clients) recorderFor(component string) record.EventRecorder {
	if c.broadcaster == nil {
		return c.Recorder
	}
	return c.broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: component})
}

// buildFunc builds a controller: it asks the shared factory for its informers and registers its event
// handlers, and returns what runs it until ctx ends (nil: the controller is off, as configured). The manager
// builds every controller before it starts the shared informers, as kube-controller-manager does: Kubernetes'
// constructors register handlers before they set the listers those handlers read (the disruption
// controller's pod handler and its PodDisruptionBudget lister), so an informer already running could call
// one too early.
type buildFunc func(ctx context.Context, c *Clients) (run func(), err error)

// runsAlone is a buildFunc for a controller that asks for its informers as it runs and starts them itself.
func runsAlone(run func(ctx context.Context, c *Clients)) buildFunc {
	return func(ctx context.Context, c *Clients) (func(), error) { return func() { run(ctx, c) }, nil }
}

// controllerEntry is a row of the controller table.
type controllerEntry struct {
	name string
	// serviceAccount is the identity the controller acts as, Kubernetes' name for the same controller.
	serviceAccount string
	build          buildFunc
}

// controllers is the table of controllers the manager runs.
var controllers = []controllerEntry{
	{"namespace", "namespace-controller", buildNamespaceController},
	{"garbage-collector", "generic-garbage-collector", buildGarbageCollector},
	{"serviceaccount", "service-account-controller", buildServiceAccountController},
	{"node-lifecycle", "node-controller", runsAlone(runNodeLifecycle)},
	{"replicaset", "replicaset-controller", buildReplicaSetController},
	{"replicationcontroller", "replication-controller", buildReplicationManager},
	{"deployment", "deployment-controller", buildDeploymentController},
	{"daemonset", "daemon-set-controller", buildDaemonSetController},
	{"statefulset", "statefulset-controller", buildStatefulSetController},
	{"endpointslice", "endpointslice-controller", buildEndpointSliceController},
	{"endpoints", "endpoint-controller", buildEndpointsController},
	{"endpointslicemirroring", "endpointslicemirroring-controller", buildEndpointSliceMirroring},
	{"clusterrole-aggregation", "clusterrole-aggregation-controller", buildClusterRoleAggregation},
	{"root-ca-cert-publisher", "root-ca-cert-publisher", buildRootCACertPublisher},
	{"certificates", "certificate-controller", buildCertificateControllers},
	{"podcertificaterequest-cleaner", "podcertificaterequestcleaner", buildPCRCleaner},
	{"job", "job-controller", buildJobController},
	{"cronjob", "cronjob-controller", buildCronJobController},
	{"ttl-after-finished", "ttl-after-finished-controller", buildTTLAfterFinishedController},
	{"disruption", "disruption-controller", buildDisruptionController},
	{"horizontal-pod-autoscaler", "horizontal-pod-autoscaler", buildHorizontalPodAutoscaler},
	{"persistentvolume-binder", "persistent-volume-binder", buildPersistentVolumeBinder},
	{"pvc-protection", "pvc-protection-controller", buildPVCProtection},
	{"pv-protection", "pv-protection-controller", buildPVProtection},
	{"resourcequota", "resourcequota-controller", buildResourceQuotaController},
	{"storage-version-migrator", "storage-version-migrator-controller", buildStorageVersionMigrator},
	{"service-lb", "service-controller", buildLoadBalancerController},
	{"servicecidrs", "service-cidrs-controller", buildServiceCIDRController},
}

// podsByNode names the pod informer's index by spec.nodeName.
const podsByNode = "nodeName"

// addSharedIndexers adds the informer indexes controllers share. Indexes cannot be added to an informer that
// has started, and several controllers would each add some of them: the manager adds them all before it
// builds the controllers and starts the factory.
func addSharedIndexers(f informers.SharedInformerFactory) error {
	pods := f.Core().V1().Pods().Informer()
	if err := pods.AddIndexers(cache.Indexers{podsByNode: func(obj any) ([]string, error) {
		return []string{obj.(*corev1.Pod).Spec.NodeName}, nil
	}}); err != nil {
		return err
	}
	// Kubernetes' controllers (Job, DaemonSet, StatefulSet) each add the pods-by-controller index if it is
	// missing; two adding it at once would collide, and one adding it once another started the factory fails.
	if err := kubecontroller.AddPodControllerIndexer(pods); err != nil {
		return err
	}
	// Likewise the DaemonSet controller's pods-by-node index, and the pods-by-claim index that the
	// PersistentVolume and pvc-protection controllers add (adding it while another controller reads the
	// indexers is a data race).
	if err := kubecontroller.AddPodNodeNameIndexer(pods); err != nil {
		return err
	}
	if err := volumecommon.AddPodPVCIndexerIfNotPresent(pods.GetIndexer()); err != nil {
		return err
	}
	// The StatefulSet controller's ControllerRevisions by owner, likewise.
	return history.AddControllerRevisionControllerIndexer(f.Apps().V1().ControllerRevisions().Informer())
}

// Run runs every controller until ctx ends (the leader lost its leadership).
func Run(ctx context.Context, c *Clients) {
	if err := addSharedIndexers(c.Informers); err != nil {
		c.Logger.Error("informer indexes: controllers not started", "error", err)
		c.informersStarted()
		return
	}
	c.restMapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(c.Discovery))
	go wait.Until(c.restMapper.Reset, 30*time.Second, ctx.Done())
	runControllers(ctx, c, controllers)
	c.Informers.Shutdown()
	c.broadcaster.Shutdown()
}

// runControllers builds every controller of table, each with the clients of its identity, then starts the
// shared informers, then runs the controllers until ctx ends.
func runControllers(ctx context.Context, c *Clients, table []controllerEntry) {
	var wg sync.WaitGroup
	var runs []func()
	for _, ctl := range table {
		own, err := c.actingAs(ctl.serviceAccount)
		if err != nil {
			c.Logger.Error("controller not started: no clients for its identity", "controller", ctl.name, "error", err)
			continue
		}
		run, err := ctl.build(ctx, own)
		if err != nil || run == nil {
			if err != nil {
				c.Logger.Error("controller not started", "controller", ctl.name, "error", err)
			}
			if own != c {
				own.broadcaster.Shutdown()
			}
			continue
		}
		runs = append(runs, func() {
			if own != c {
				defer own.broadcaster.Shutdown()
			}
			c.Logger.Info("controller starting", "controller", ctl.name, "as", ctl.serviceAccount)
			run()
		})
	}
	c.Informers.Start(ctx.Done())
	c.informersStarted()
	for _, run := range runs {
		wg.Go(run)
	}
	wg.Wait()
}
