package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/skiff-dev/skiff/config"
)

// Agent runs the pods bound to its nodes.
type Agent struct {
	cfg     *config.Agent
	logger  hclog.Logger
	runtime Runtime
	client  kubernetes.Interface
	nodes   map[string]bool // the nodes this agent hosts
	pods    cache.Indexer
	queue   workqueue.TypedRateLimitingInterface[string]
	// running is the last version of each pod the runtime was asked to run, by namespace/name, so that a
	// pod that vanished (force-deleted) or was replaced (same name, new UID) is still stopped.
	mu      sync.Mutex
	running map[string]*corev1.Pod
}

// New builds an agent. Only the simulated runtime exists so far; the containerd runtime is the next step.
func New(cfg *config.Agent, logger hclog.Logger) (*Agent, error) {
	a := &Agent{cfg: cfg, logger: logger, nodes: map[string]bool{}, running: map[string]*corev1.Pod{}}
	switch cfg.Runtime {
	case config.RuntimeSimulated:
		a.runtime = newSimulatedRuntime()
	default:
		return nil, fmt.Errorf("agent.runtime %q is not available in this build yet; use \"simulated\"", cfg.Runtime)
	}
	for _, name := range a.nodeNames() {
		a.nodes[name] = true
	}
	return a, nil
}

// nodeNames are the nodes the agent hosts: its name, or <name>-0 to <name>-<N-1> when simulating N nodes.
func (a *Agent) nodeNames() []string {
	if a.cfg.Runtime != config.RuntimeSimulated || a.cfg.Simulated.Nodes == 1 {
		return []string{a.cfg.Name}
	}
	names := make([]string, a.cfg.Simulated.Nodes)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", a.cfg.Name, i)
	}
	return names
}

// Run joins the cluster, registers the nodes and runs their pods until ctx ends.
//  1. Fetch and check the cluster CA, and authenticate with the join token; a refusal stops the agent.
//  2. Register each Node: capacity, addresses, labels, taints, nodeInfo, Ready.
//  3. Watch the pods bound to the nodes and sync each one in its worker.
func (a *Agent) Run(ctx context.Context) error {
	restCfg, err := restConfig(ctx, a.cfg, a.cfg.Name)
	if err != nil {
		return err
	}
	if a.client, err = kubernetes.NewForConfig(restCfg); err != nil {
		return err
	}
	if _, err := a.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{Limit: 1}); apierrors.IsUnauthorized(err) {
		return ErrJoinRefused
	} else if err != nil {
		return fmt.Errorf("reaching the API at %v: %w", a.cfg.Servers, err)
	}
	if err := a.registerNodes(ctx); err != nil {
		return err
	}
	a.logger.Info("nodes registered", "nodes", len(a.nodes), "runtime", a.runtime.Version())

	selector := fields.OneTermNotEqualSelector("spec.nodeName", "").String()
	if len(a.nodes) == 1 {
		selector = fields.OneTermEqualSelector("spec.nodeName", a.cfg.Name).String()
	}
	factory := informers.NewSharedInformerFactoryWithOptions(a.client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = selector }))
	podInformer := factory.Core().V1().Pods().Informer()
	a.pods = podInformer.GetIndexer()
	a.queue = workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	enqueue := func(obj any) {
		if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if pod, ok := obj.(*corev1.Pod); ok && a.nodes[pod.Spec.NodeName] {
			a.queue.Add(pod.Namespace + "/" + pod.Name)
		}
	}
	podInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: enqueue, UpdateFunc: func(_, o any) { enqueue(o) }, DeleteFunc: enqueue})
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), podInformer.HasSynced) {
		return ctx.Err()
	}
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for a.processNext(ctx) {
			}
		}()
	}
	<-ctx.Done()
	a.queue.ShutDown()
	wg.Wait()
	return nil
}

func (a *Agent) processNext(ctx context.Context) bool {
	key, quit := a.queue.Get()
	if quit {
		return false
	}
	defer a.queue.Done(key)
	if err := a.syncPod(ctx, key); err != nil {
		if ctx.Err() == nil {
			a.logger.Warn("syncing pod", "pod", key, "error", err)
		}
		a.queue.AddRateLimited(key)
		return true
	}
	a.queue.Forget(key)
	return true
}

// syncPod computes what a pod needs, then does it:
//  1. gone from the API, or replaced by a new pod of the same name: stop what still runs of the old one;
//  2. being deleted: kill its containers within the grace period, then confirm with a grace-0 delete;
//  3. otherwise: bring it up with the runtime and write its status if it changed.
func (a *Agent) syncPod(ctx context.Context, key string) error {
	obj, exists, err := a.pods.GetByKey(key)
	if err != nil {
		return err
	}
	a.mu.Lock()
	old := a.running[key]
	a.mu.Unlock()
	if old != nil && (!exists || obj.(*corev1.Pod).UID != old.UID) {
		if err := a.runtime.KillPod(ctx, old, 0); err != nil {
			return err
		}
		a.setRunning(key, nil)
	}
	if !exists {
		return nil
	}
	pod := obj.(*corev1.Pod)
	if pod.DeletionTimestamp != nil {
		grace := time.Duration(0)
		if pod.DeletionGracePeriodSeconds != nil {
			grace = time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
		}
		if err := a.runtime.KillPod(ctx, pod, grace); err != nil {
			return err
		}
		a.setRunning(key, nil)
		zero := int64(0)
		err := a.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &pod.UID}})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return nil // already gone, or a new pod of the same name
		}
		return err
	}
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil
	}
	a.setRunning(key, pod)
	state, err := a.runtime.SyncPod(ctx, pod)
	if err != nil {
		return err
	}
	status := podStatus(pod, state, a.cfg.AdvertiseAddr)
	if apiequality.Semantic.DeepEqual(status, pod.Status) {
		return nil
	}
	updated := pod.DeepCopy()
	updated.Status = status
	_, err = a.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil // the watch brings the newer version, which is synced again
	}
	return err
}

func (a *Agent) setRunning(key string, pod *corev1.Pod) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if pod == nil {
		delete(a.running, key)
		return
	}
	a.running[key] = pod
}

// registerNodes registers every hosted node, sixteen at a time.
func (a *Agent) registerNodes(ctx context.Context) error {
	host, err := readHost(a.cfg.DataDir)
	if err != nil {
		return err
	}
	names := a.nodeNames()
	errs := make([]error, len(names))
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i, name := range names {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			node, err := registerNode(ctx, a.client, a.nodeSpec(i, name, host))
			if errs[i] = err; err == nil && node.Spec.PodCIDR != "" {
				if sim, ok := a.runtime.(*simulatedRuntime); ok {
					sim.setPodCIDR(name, node.Spec.PodCIDR)
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// nodeSpec is what the agent maintains of node i.
func (a *Agent) nodeSpec(i int, name string, host hostFacts) nodeSpec {
	labels := map[string]string{
		corev1.LabelHostname: name, corev1.LabelOSStable: runtime.GOOS, corev1.LabelArchStable: runtime.GOARCH,
	}
	for k, v := range a.cfg.NodeLabels {
		labels[k] = v
	}
	cpu, memory, pods := host.cpu, host.memory, a.cfg.MaxPods
	if a.cfg.Runtime == config.RuntimeSimulated {
		sim := a.cfg.Simulated
		cpu, memory, pods = sim.CPU, sim.Memory, sim.Pods
		for k, v := range sim.Labels {
			labels[k] = strings.ReplaceAll(v, "%d", fmt.Sprint(i%sim.Zones))
		}
	}
	capacity := corev1.ResourceList{
		corev1.ResourceCPU: cpu, corev1.ResourceMemory: memory, corev1.ResourceEphemeralStorage: host.ephemeral,
		corev1.ResourcePods: *resource.NewQuantity(int64(pods), resource.DecimalSI),
	}
	now := metav1.Now()
	podCIDR := ""
	if a.cfg.Runtime != config.RuntimeSimulated || a.cfg.Simulated.Nodes == 1 {
		podCIDR = a.cfg.PodCIDR
	}
	return nodeSpec{
		name: name, podCIDR: podCIDR, labels: labels, taints: a.cfg.NodeTaints,
		status: corev1.NodeStatus{
			Capacity: capacity, Allocatable: capacity.DeepCopy(),
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: a.cfg.AdvertiseAddr}, {Type: corev1.NodeHostName, Address: name}},
			Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "AgentReady",
				Message: "skiff agent is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now}},
			NodeInfo: corev1.NodeSystemInfo{KernelVersion: host.kernel, OSImage: host.osImage, OperatingSystem: runtime.GOOS,
				Architecture: runtime.GOARCH, ContainerRuntimeVersion: a.runtime.Version(), KubeletVersion: "skiff"},
		},
	}
}
