package nodeagent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	resourcehelper "k8s.io/component-helpers/resource"

	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/gossip"
	"github.com/skiff-dev/skiff/internal/version"
	"github.com/skiff-dev/skiff/nodeagent/netpol"
	"github.com/skiff-dev/skiff/nodeagent/proxy"
	"github.com/skiff-dev/skiff/nodeagent/stats"
)

// Agent runs the pods bound to its nodes.
type Agent struct {
	cfg      *config.Agent
	logger   hclog.Logger
	runtime  Runtime
	client   kubernetes.Interface
	recorder record.EventRecorder
	nodes    map[string]bool // the nodes this agent hosts
	pods     podStore        // the pods bound to them, as the informers see them
	pool     *gossip.Pool    // nil without retry_join
	// announced is the servers' API addresses the pool last announced, kept for when it sees none alive
	// (the agent cut off from every server, or its gossip view behind): see serverAddrs.
	announcedMu sync.Mutex
	announced   []string
	facts       *clusterFacts // the servers' skiff-cluster ConfigMap: cluster DNS address and domain
	ctx         context.Context

	mu sync.Mutex
	// workers holds one goroutine per pod, by namespace/name: a pod's syncs never overlap, and a pod that
	// waits out a long grace period holds up no other pod.
	workers map[string]*podWorker
	// running is the last version of each pod the runtime was asked to run, by namespace/name, so that a
	// pod that vanished (force-deleted) or was replaced (same name, new UID) is still stopped.
	running map[string]*corev1.Pod
	// finished holds the pods that ran to their end here (by namespace/name), whose containers' logs the
	// runtime keeps until the pod is gone; a finished pod is never synced into running again.
	finished map[string]*corev1.Pod
	wg       sync.WaitGroup
	// deadlines holds, by namespace/name, the wake-up of each pod with an active deadline (wakeAt).
	deadlines map[string]*time.Timer
	// statusWrites bounds the concurrent status writes, so that thousands of pods starting at once (a
	// simulated node's, say) queue here rather than at the servers' in-flight limit.
	statusWrites chan struct{}
}

// podWorker is a pod's goroutine; kick wakes it for one more sync.
type podWorker struct {
	kick chan struct{}
}

// New builds an agent.
func New(cfg *config.Agent, logger hclog.Logger) (*Agent, error) {
	a := &Agent{cfg: cfg, logger: logger, nodes: map[string]bool{}, workers: map[string]*podWorker{},
		running: map[string]*corev1.Pod{}, finished: map[string]*corev1.Pod{}, statusWrites: make(chan struct{}, 16), facts: newClusterFacts()}
	if err := validateDNS(cfg); err != nil {
		return nil, err
	}
	switch cfg.Runtime {
	case config.RuntimeSimulated:
		a.runtime = newSimulatedRuntime()
	case config.RuntimeContainerd:
		// Connected in Run, which has the context that supervises a private containerd.
	default:
		return nil, fmt.Errorf("agent.runtime %q is not one of containerd, simulated", cfg.Runtime)
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

// apiAccess is the node's identity (nodeAccess), or, for many simulated nodes, the kubeconfig's user: one
// node identity may write only its own Node.
func (a *Agent) apiAccess(ctx context.Context) (*apiAccess, error) {
	nodes := len(a.nodeNames())
	if a.cfg.Simulated.Kubeconfig == "" || nodes <= 1 {
		return nodeAccess(ctx, a.cfg, a.cfg.Name, a.serverAddrs, a.logger)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", a.cfg.Simulated.Kubeconfig)
	if err != nil {
		return nil, err
	}
	// The client rate of the kubelets it stands in for, each of which has its own (50 a second, bursts of
	// 100, the kubelet's defaults): at one node's rate, the status writes and events of all its nodes' pods
	// queued behind each other here.
	cfg.UserAgent, cfg.QPS, cfg.Burst = "skiff-agent/"+a.cfg.Name, float32(50*nodes), 100*nodes
	caPEM := cfg.TLSClientConfig.CAData
	if caPEM == nil && cfg.TLSClientConfig.CAFile != "" {
		if caPEM, err = os.ReadFile(cfg.TLSClientConfig.CAFile); err != nil {
			return nil, err
		}
	}
	return &apiAccess{config: cfg, caPEM: caPEM}, nil
}

// Run joins the cluster, registers the nodes and runs their pods until ctx ends.
//  1. Fetch and check the cluster CA, and authenticate with the join token; a refusal stops the agent.
//  2. Connect to containerd (starting a private one when none is configured).
//  3. Register each Node: capacity, addresses, labels, taints, nodeInfo, Ready.
//  4. Watch the pods bound to the nodes; remove what runs of pods that no longer exist; then sync each pod
//     in its own worker.
func (a *Agent) Run(ctx context.Context) error {
	a.ctx = ctx
	if len(a.cfg.RetryJoin) > 0 {
		pool, err := a.joinPool(ctx)
		if err != nil {
			return err
		}
		a.pool = pool
		defer func() {
			// Stopped on purpose (SIGTERM): say so, so the leader marks the Nodes shut down, not unreachable.
			if err := pool.Leave(5 * time.Second); err != nil {
				a.logger.Warn("leaving the gossip pool", "error", err)
			}
			pool.Shutdown()
		}()
		a.logger.Info("joined the gossip pool", "address", gossipAddr(a.cfg))
		if err := a.waitForServers(ctx); err != nil {
			return err
		}
	}
	access, err := a.apiAccess(ctx)
	if err != nil {
		return err
	}
	if a.client, err = kubernetes.NewForConfig(access.config); err != nil {
		return err
	}
	// The servers may still be electing a leader: wait for the API.
	for {
		_, err := a.client.CoreV1().Nodes().Get(ctx, a.cfg.Name, metav1.GetOptions{})
		if apierrors.IsUnauthorized(err) {
			return ErrJoinRefused
		} else if err == nil || apierrors.IsNotFound(err) {
			break
		}
		a.logger.Warn("waiting for the API", "servers", a.serverAddrs(), "error", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("reaching the API at %v: %w", a.serverAddrs(), err)
		case <-time.After(2 * time.Second):
		}
	}
	if err := a.checkVersionSkew(ctx); err != nil {
		return err
	}
	stopKeyring := a.followGossipKeyring(ctx, keyringPollInterval) // stopped before the pool leaves
	defer stopKeyring()
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	defer broadcaster.Shutdown()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: a.client.CoreV1().Events("")})
	a.recorder = broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "kubelet", Host: a.cfg.Name})
	var services informers.SharedInformerFactory
	if a.cfg.Runtime == config.RuntimeContainerd {
		// The lock that shows other agents on this host that this one's rules and bridge are alive; then what
		// agents that died without cleaning up left goes (deadagents.go: a stale masquerade chain would hijack
		// pod traffic, a stale bridge the route to the pod CIDR).
		owner, err := proxy.Claim(a.cfg.DataDir, 10*time.Second)
		if err != nil {
			return err
		}
		defer owner.Release()
		removeDeadAgents(ctx, a.cfg, hostID(a.cfg.Name, a.cfg.DataDir), a.logger)
		rt, err := newContainerdRuntime(ctx, a.cfg, a.logger)
		if err != nil {
			return err
		}
		defer rt.Close()
		a.runtime = rt
		// Every Service, for the pods' service links (env.go); listed before the first pod starts, below.
		services = informers.NewSharedInformerFactory(a.client, 0)
		rt.services = services.Core().V1().Services().Lister()
		if a.cfg.NetworkPolicy {
			id := hostID(a.cfg.Name, a.cfg.DataDir)
			engine, err := netpol.New(netpol.Config{ID: id, Owner: proxy.OwnerComment(id, a.cfg.DataDir), Client: a.client,
				Local: func(node string) bool { return a.nodes[node] }, Logger: a.logger.Named("netpol")})
			if err != nil {
				return fmt.Errorf("%w (or set agent.network_policy.enabled = false)", err)
			}
			rt.policies = engine
		}
	}
	if err := a.registerNodes(ctx); err != nil {
		return err
	}
	a.logger.Info("nodes registered", "nodes", len(a.nodes), "runtime", a.runtime.Version())
	if rt, ok := a.runtime.(*containerdRuntime); ok && rt.policies != nil {
		a.wg.Add(1) // its chains stay in force when it stops: pods outlive the agent
		go func() {
			defer a.wg.Done()
			if err := rt.policies.Run(ctx); err != nil {
				a.logger.Warn("network policies", "error", err)
			}
		}()
	}
	if a.cfg.Runtime == config.RuntimeContainerd {
		a.watchClusterFacts(ctx, 15*time.Second) // before the first pod's resolv.conf
		services.Start(ctx.Done())
		defer services.Shutdown()
		if !cache.WaitForCacheSync(ctx.Done(), services.Core().V1().Services().Informer().HasSynced) {
			return ctx.Err()
		}
	}

	// A watch of each node's pods, as each kubelet has (a simulated agent hosting many nodes has one per node,
	// so that it holds only its own pods and the servers serve the watches a cluster of that size has).
	var stores multiStore
	var synced []cache.InformerSynced
	var factories []informers.SharedInformerFactory
	var podInformers []cache.SharedIndexInformer
	for _, node := range slices.Sorted(maps.Keys(a.nodes)) {
		selector := fields.OneTermEqualSelector("spec.nodeName", node).String()
		factory := informers.NewSharedInformerFactoryWithOptions(a.client, 0,
			informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = selector }))
		informer := factory.Core().V1().Pods().Informer()
		factories, podInformers = append(factories, factory), append(podInformers, informer)
		stores, synced = append(stores, informer.GetIndexer()), append(synced, informer.HasSynced)
	}
	a.pods = stores
	enqueue := func(obj any) {
		if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if pod, ok := obj.(*corev1.Pod); ok && a.nodes[pod.Spec.NodeName] {
			a.kick(pod.Namespace+"/"+pod.Name, 0)
		}
	}
	defer func() {
		a.wg.Wait() // the workers end with ctx
	}()
	for _, factory := range factories {
		defer factory.Shutdown()
	}
	for _, informer := range podInformers {
		informer.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: enqueue, DeleteFunc: enqueue, UpdateFunc: func(old, cur any) {
			if agentRelevantChange(old.(*corev1.Pod), cur.(*corev1.Pod)) {
				enqueue(cur)
			}
		}})
	}
	for _, factory := range factories {
		factory.Start(ctx.Done())
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return ctx.Err()
	}
	if err := a.runtime.Cleanup(ctx, a.knownPod); err != nil {
		a.logger.Warn("removing the containers of deleted pods", "error", err)
	}
	endpointErr := make(chan error, 1)
	if a.cfg.Runtime == config.RuntimeContainerd {
		if err := a.startEndpoint(ctx, access.caPEM, endpointErr); err != nil {
			return err
		}
		go a.resyncAll(ctx, 30*time.Second)
		go a.syncPodRoutes(ctx)
		if rt, ok := a.runtime.(*containerdRuntime); ok && a.cfg.DNS.Enabled {
			node, err := a.client.CoreV1().Nodes().Get(ctx, a.cfg.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			a.wg.Add(1) // CoreDNS stops before Run returns
			go func() {
				defer a.wg.Done()
				a.runClusterDNS(ctx, access, node, rt.podCIDR)
			}()
		}
		if a.cfg.Proxy.Enabled {
			p, err := proxy.New(proxy.Config{NodeName: a.cfg.Name, ID: hostID(a.cfg.Name, a.cfg.DataDir), DataDir: a.cfg.DataDir,
				PodCIDR: a.cfg.PodCIDR, Client: a.client, Recorder: a.recorder, Logger: a.logger.Named("proxy"),
				MinSyncInterval: a.cfg.Proxy.MinSyncInterval, FullSyncInterval: a.cfg.Proxy.FullSyncInterval})
			if err != nil {
				return fmt.Errorf("%w (or set agent.proxy.enabled = false)", err)
			}
			a.wg.Add(1) // waited for before the lock is released: a clean stop removes the service chains first
			go func() {
				defer a.wg.Done()
				if err := p.Run(ctx); err != nil {
					a.logger.Warn("service proxy", "error", err)
				}
			}()
		}
		if a.pool != nil && len(a.nodes) == 1 {
			a.wg.Add(1)
			go func() {
				defer a.wg.Done()
				a.announceLoadBalancers(ctx, a.pool)
			}()
		}
	}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		a.runLocalPath(ctx)
	}()
	if a.pool == nil {
		go a.renewLeases(ctx)
	}
	if lister, ok := a.runtime.(imageLister); ok {
		go a.reportImages(ctx, lister, 30*time.Second)
	}
	select {
	case <-ctx.Done():
		return nil
	case err := <-endpointErr:
		return err
	}
}

// startEndpoint serves the agent's HTTPS endpoint (endpoint.go) in the background; a failure to serve is sent
// on errs and stops the agent.
func (a *Agent) startEndpoint(ctx context.Context, caPEM []byte, errs chan<- error) error {
	rt := a.runtime.(*containerdRuntime)
	streams, err := newStreamingServer(rt)
	if err != nil {
		return err
	}
	reader, err := stats.NewReader(containerdNamespace)
	if err != nil {
		return err
	}
	ep := &endpoint{cfg: a.cfg, logger: a.logger.Named("endpoint"), client: a.client, caPEM: caPEM, rt: rt,
		pods: podLookup{a.pods}, streams: streams, metrics: stats.Handler(reader, a.runningContainers)}
	go func() {
		if err := ep.serve(ctx); err != nil {
			errs <- err
		}
	}()
	return nil
}

// podStore is what the agent reads of its informers' pods.
type podStore interface {
	List() []any
	ListKeys() []string
	GetByKey(key string) (item any, exists bool, err error)
}

// multiStore is the pods of several informers, one per node; a pod is bound to one node, so it is in one.
type multiStore []cache.Indexer

func (m multiStore) List() []any {
	var out []any
	for _, s := range m {
		out = append(out, s.List()...)
	}
	return out
}

func (m multiStore) ListKeys() []string {
	var out []string
	for _, s := range m {
		out = append(out, s.ListKeys()...)
	}
	return out
}

func (m multiStore) GetByKey(key string) (any, bool, error) {
	for _, s := range m {
		if obj, ok, err := s.GetByKey(key); ok || err != nil {
			return obj, ok, err
		}
	}
	return nil, false, nil
}

// agentRelevantChange tells whether an update asks anything new of the agent. Like the kubelet, it ignores
// status-only updates, its own included: a sync right after each status write would cut short the states the
// status shows for a while (ErrImagePull before ImagePullBackOff, say).
func agentRelevantChange(old, cur *corev1.Pod) bool {
	return old.UID != cur.UID || !apiequality.Semantic.DeepEqual(old.Spec, cur.Spec) ||
		!apiequality.Semantic.DeepEqual(old.Labels, cur.Labels) || !apiequality.Semantic.DeepEqual(old.Annotations, cur.Annotations) ||
		!old.DeletionTimestamp.Equal(cur.DeletionTimestamp) || !ptrEqual(old.DeletionGracePeriodSeconds, cur.DeletionGracePeriodSeconds) ||
		old.Status.Phase != cur.Status.Phase
}

func ptrEqual[T comparable](a, b *T) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

// knownPod tells whether a pod with this UID is bound to the agent's nodes now, in the informer's view.
func (a *Agent) knownPod(uid types.UID) bool {
	for _, obj := range a.pods.List() {
		if obj.(*corev1.Pod).UID == uid {
			return true
		}
	}
	return false
}

// resyncAll syncs every pod periodically, as the kubelet does, to catch what no event announces (a sandbox
// that died, say).
func (a *Agent) resyncAll(ctx context.Context, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			for _, key := range a.pods.ListKeys() {
				a.kick(key, 0)
			}
		}
	}
}

// kick asks for a sync of the pod, after a delay when after > 0; it starts the pod's worker when needed.
func (a *Agent) kick(key string, after time.Duration) {
	if after > 0 {
		time.AfterFunc(after, func() { a.kick(key, 0) })
		return
	}
	if a.ctx == nil || a.ctx.Err() != nil {
		return
	}
	a.mu.Lock()
	w := a.workers[key]
	if w == nil {
		w = &podWorker{kick: make(chan struct{}, 1)}
		a.workers[key] = w
		a.wg.Add(1)
		go a.runWorker(key, w)
	}
	// Sent under the lock: a worker deciding to end checks for a pending kick under it, so none is lost.
	select {
	case w.kick <- struct{}{}:
	default: // a sync is already due; it will see the latest pod
	}
	a.mu.Unlock()
}

// runWorker syncs one pod whenever kicked, retries failures with backoff (0.5 s doubling to 30 s), and ends
// when the pod is gone and nothing of it runs.
func (a *Agent) runWorker(key string, w *podWorker) {
	defer a.wg.Done()
	failures := 0
	for {
		select {
		case <-a.ctx.Done():
			return
		case <-w.kick:
		}
		done, err := a.syncPod(a.ctx, key)
		if err != nil && a.ctx.Err() == nil {
			a.logger.Warn("syncing pod", "pod", key, "error", err)
			failures++
			a.kick(key, min(250*time.Millisecond<<min(failures, 8), 30*time.Second))
		} else {
			failures = 0
		}
		if done {
			a.mu.Lock()
			if len(w.kick) == 0 {
				delete(a.workers, key)
				a.mu.Unlock()
				return
			}
			a.mu.Unlock()
		}
	}
}

// syncPod computes what a pod needs, then does it; done is true once the pod is gone and nothing of it runs.
//  1. gone from the API, or replaced by a new pod of the same name: stop what still runs of the old one;
//  2. being deleted: kill its containers within the grace period, then confirm with a grace-0 delete;
//  3. finished (Succeeded or Failed): make sure its containers and sandbox are removed; the status stays;
//  4. otherwise: admit it if it has not started (admit.go: sysctls, host ports), or refuse it for good; fail
//     it once it is past its activeDeadlineSeconds; bring it up with the runtime and write its status if it
//     changed.
func (a *Agent) syncPod(ctx context.Context, key string) (bool, error) {
	obj, exists, err := a.pods.GetByKey(key)
	if err != nil {
		return false, err
	}
	a.mu.Lock()
	old := a.running[key]
	a.mu.Unlock()
	if old != nil && (!exists || obj.(*corev1.Pod).UID != old.UID) {
		if err := a.runtime.KillPod(ctx, old, a.graceOf(key, old)); err != nil {
			return false, err
		}
		a.setRunning(key, nil)
	}
	a.mu.Lock()
	done := a.finished[key]
	a.mu.Unlock()
	if done != nil && (!exists || obj.(*corev1.Pod).UID != done.UID) {
		// The logs a finished pod kept go with it (the API deletes a finished pod at once, with no grace).
		gone := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: done.UID, Name: done.Name, Namespace: done.Namespace}}
		if err := a.runtime.KillPod(ctx, gone, func() time.Duration { return 0 }); err != nil {
			return false, err
		}
		a.setFinished(key, nil)
	}
	if !exists {
		a.mu.Lock()
		if t := a.deadlines[key]; t != nil {
			t.Stop()
			delete(a.deadlines, key)
		}
		a.mu.Unlock()
		return true, nil
	}
	pod := obj.(*corev1.Pod)
	if done != nil && done.UID == pod.UID && pod.DeletionTimestamp == nil {
		// This pod ran to its end here, though the informer's copy may not say so yet: the status write that
		// said Succeeded can come back through the watch after a sync that an exit or an event queued. Read as
		// Pending, the pod would be started again in a new sandbox (its containers are gone). Like the
		// kubelet's pod workers, the agent remembers the pods it finished and never runs one again.
		return false, nil
	}
	if pod.DeletionTimestamp != nil {
		if err := a.runtime.KillPod(ctx, pod, a.graceOf(key, pod)); err != nil {
			return false, err
		}
		a.setRunning(key, nil)
		if pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed {
			// As the kubelet's TerminatePod: a pod killed for its deletion ends in a terminal phase before it
			// goes, so that whoever holds a finalizer on it (the Job controller) sees how it ended.
			state := &PodState{IP: pod.Status.PodIP, Killed: true,
				InitContainers:      terminatedUnknown(pod.Status.InitContainerStatuses),
				Containers:          terminatedUnknown(pod.Status.ContainerStatuses),
				EphemeralContainers: terminatedUnknown(pod.Status.EphemeralContainerStatuses)}
			if _, written, err := a.writeStatus(ctx, key, pod, podStatus(pod, state, a.cfg.AdvertiseAddr)); err != nil || !written {
				return false, err // not written: a newer version is on its way (kicked), or the pod is gone
			}
		}
		zero := int64(0)
		err := a.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &pod.UID}})
		if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
			return false, nil // already gone, or a new pod of the same name; the watch says which
		}
		return false, err
	}
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		if err := a.runtime.KillPod(ctx, pod, func() time.Duration { return 0 }); err != nil {
			return false, err
		}
		a.setRunning(key, nil)
		a.setFinished(key, pod)
		return false, nil
	}
	if res := a.admit(key, pod); res.reason != "" {
		return false, a.reject(ctx, key, pod, res)
	}
	if exceeded, left := activeDeadlineExceeded(pod, time.Now()); exceeded {
		return false, a.failPastDeadline(ctx, key, pod)
	} else if left > 0 {
		a.wakeAt(key, left)
	}
	a.setRunning(key, pod)
	state, syncErr := a.runtime.SyncPod(ctx, pod)
	if state == nil {
		return false, syncErr
	}
	status := podStatus(pod, state, a.cfg.AdvertiseAddr)
	if apiequality.Semantic.DeepEqual(status, pod.Status) {
		return false, syncErr
	}
	updated, written, err := a.writeStatus(ctx, key, pod, status)
	if err != nil {
		return false, err
	}
	if !written {
		return false, syncErr
	}
	if status.Phase == corev1.PodSucceeded || status.Phase == corev1.PodFailed {
		// Finished: its containers and sandbox go now; the status and the containers' logs stay for the
		// user until the pod is deleted.
		if err := a.runtime.KillPod(ctx, updated, func() time.Duration { return 0 }); err != nil {
			return false, err
		}
		a.setRunning(key, nil)
		a.setFinished(key, updated)
		return false, nil
	}
	return false, syncErr
}

// writeStatus writes the pod's status. written is false when the API refused it as stale (a newer version
// is on its way, and the pod is synced again against it) or the pod is gone.
func (a *Agent) writeStatus(ctx context.Context, key string, pod *corev1.Pod, status corev1.PodStatus) (updated *corev1.Pod, written bool, err error) {
	updated = pod.DeepCopy()
	updated.Status = status
	select {
	case a.statusWrites <- struct{}{}:
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
	_, err = a.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{})
	<-a.statusWrites
	if apierrors.IsConflict(err) {
		a.kick(key, 100*time.Millisecond) // a newer version is on its way; sync against it
		return updated, false, nil
	}
	if apierrors.IsNotFound(err) {
		return updated, false, nil
	}
	return updated, err == nil, err
}

// admit runs the node's admission (admit.go) for a pod the agent has not started: its sysctls, then its host
// ports against the pods admitted before it. Admitted, it counts as running from then on, so the next pod's
// check sees its ports.
func (a *Agent) admit(key string, pod *corev1.Pod) admissionResult {
	a.mu.Lock()
	defer a.mu.Unlock()
	if cur := a.running[key]; (cur != nil && cur.UID == pod.UID) || pod.Status.StartTime != nil {
		return admissionResult{}
	}
	if res := admitSysctls(pod); res.reason != "" {
		return res
	}
	if len(hostPorts(pod)) == 0 {
		// Most pods ask for no host port: no need to look at the node's other pods (thousands, on a
		// simulated node).
		a.running[key] = pod
		return admissionResult{}
	}
	var admitted []*corev1.Pod
	seen := map[types.UID]bool{pod.UID: true}
	for _, p := range a.running {
		if !seen[p.UID] && p.Spec.NodeName == pod.Spec.NodeName {
			seen[p.UID] = true
			admitted = append(admitted, p)
		}
	}
	for _, obj := range a.pods.List() {
		p := obj.(*corev1.Pod)
		if seen[p.UID] || p.Spec.NodeName != pod.Spec.NodeName || p.Status.StartTime == nil ||
			p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		if f := a.finished[p.Namespace+"/"+p.Name]; f != nil && f.UID == p.UID {
			continue
		}
		admitted = append(admitted, p)
	}
	if res := admitHostPorts(pod, admitted); res.reason != "" {
		return res
	}
	a.running[key] = pod
	return admissionResult{}
}

// reject fails a pod the node's admission refused, as the kubelet's rejectPod: a Warning event with the
// reason, and the status Failed with "Pod was rejected: <message>". Nothing of the pod ever runs.
func (a *Agent) reject(ctx context.Context, key string, pod *corev1.Pod, res admissionResult) error {
	if a.recorder != nil {
		a.recorder.Eventf(pod, corev1.EventTypeWarning, res.reason, "%s", res.message)
	}
	status := *pod.Status.DeepCopy()
	status.Phase, status.Reason, status.Message = corev1.PodFailed, res.reason, "Pod was rejected: "+res.message
	status.ObservedGeneration = pod.Generation
	updated, written, err := a.writeStatus(ctx, key, pod, status)
	if written {
		a.setFinished(key, updated)
	}
	return err
}

// failPastDeadline ends a pod past its activeDeadlineSeconds, as the kubelet's active deadline handler: a
// DeadlineExceeded event, its containers killed within their grace period and removed, then the pod Failed
// with reason DeadlineExceeded; the containers that ran report ContainerStatusUnknown, as the kubelet's do
// once they are gone.
func (a *Agent) failPastDeadline(ctx context.Context, key string, pod *corev1.Pod) error {
	if a.recorder != nil {
		a.recorder.Eventf(pod, corev1.EventTypeNormal, deadlineReason, deadlineMessage)
	}
	if err := a.runtime.KillPod(ctx, pod, func() time.Duration { return terminationGrace(pod) }); err != nil {
		return err
	}
	a.setRunning(key, nil)
	state := &PodState{IP: pod.Status.PodIP, FailReason: deadlineReason, FailMessage: deadlineMessage,
		InitContainers:      terminatedUnknown(pod.Status.InitContainerStatuses),
		Containers:          terminatedUnknown(pod.Status.ContainerStatuses),
		EphemeralContainers: terminatedUnknown(pod.Status.EphemeralContainerStatuses)}
	updated, written, err := a.writeStatus(ctx, key, pod, podStatus(pod, state, a.cfg.AdvertiseAddr))
	if written {
		a.setFinished(key, updated)
	}
	return err
}

// wakeAt syncs the pod again after d (its active deadline), replacing the wake-up an earlier sync set.
func (a *Agent) wakeAt(key string, d time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.deadlines == nil {
		a.deadlines = map[string]*time.Timer{}
	}
	if t := a.deadlines[key]; t != nil {
		t.Stop()
	}
	a.deadlines[key] = time.AfterFunc(d, func() { a.kick(key, 0) })
}

// graceOf is the pod's grace period as the API says now: the API may shorten it while the agent waits.
func (a *Agent) graceOf(key string, pod *corev1.Pod) func() time.Duration {
	return func() time.Duration {
		latest := pod
		if obj, ok, _ := a.pods.GetByKey(key); ok && obj.(*corev1.Pod).UID == pod.UID {
			latest = obj.(*corev1.Pod)
		}
		if latest.DeletionGracePeriodSeconds != nil {
			return time.Duration(*latest.DeletionGracePeriodSeconds) * time.Second
		}
		return 0
	}
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

func (a *Agent) setFinished(key string, pod *corev1.Pod) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if pod == nil {
		delete(a.finished, key)
		return
	}
	a.finished[key] = pod
}

// apiObjects reads the ConfigMaps, Secrets and RuntimeClasses that pods refer to from the API; certs, when
// set, serves clusterTrustBundle and podCertificate projections (certificates.go).
type apiObjects struct {
	client kubernetes.Interface
	certs  *nodeCertificates
}

func (o apiObjects) ConfigMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error) {
	return o.client.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
}

func (o apiObjects) Secret(ctx context.Context, namespace, name string) (*corev1.Secret, error) {
	return o.client.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
}

func (o apiObjects) RuntimeClass(ctx context.Context, name string) (*nodev1.RuntimeClass, error) {
	return o.client.NodeV1().RuntimeClasses().Get(ctx, name, metav1.GetOptions{})
}

// registered hands a registered Node's pod CIDR and allocatable to the runtime.
func (a *Agent) registered(node *corev1.Node) {
	switch rt := a.runtime.(type) {
	case *simulatedRuntime:
		if node.Spec.PodCIDR != "" {
			rt.setPodCIDR(node.Name, node.Spec.PodCIDR)
		}
	case *containerdRuntime:
		rt.dnsFacts = a.facts.podDNS
		rt.nodeRequests = a.nodeRequests
		objects := apiObjects{client: a.client, certs: newNodeCertificates(a.ctx, a.client, a.recorder, node.Name, a.kick)}
		rt.attach(objects, a.recorder, func(pod *corev1.Pod, after time.Duration) {
			a.kick(pod.Namespace+"/"+pod.Name, after)
		}, node)
	}
}

// nodeRequests sums the cpu and memory requests of the pods the agent runs on the pod's node, other than
// the pod itself: a pod with a resize under way counts with the larger of what it asks and what it was given,
// as the scheduler counts it.
func (a *Agent) nodeRequests(except *corev1.Pod) corev1.ResourceList {
	a.mu.Lock()
	defer a.mu.Unlock()
	sum := corev1.ResourceList{}
	for _, p := range a.running {
		if p.UID == except.UID || p.Spec.NodeName != except.Spec.NodeName {
			continue
		}
		for name, q := range resourcehelper.PodRequests(p, resourcehelper.PodResourcesOptions{UseStatusResources: true}) {
			total := sum[name]
			total.Add(q)
			sum[name] = total
		}
	}
	return sum
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
			if errs[i] = err; err == nil {
				a.registered(node)
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
	var endpoints corev1.NodeDaemonEndpoints
	if a.cfg.Runtime == config.RuntimeContainerd {
		endpoints.KubeletEndpoint.Port = int32(a.cfg.AgentPort)
	}
	return nodeSpec{
		name: name, podCIDR: podCIDR, labels: labels, taints: a.cfg.NodeTaints,
		status: corev1.NodeStatus{
			DaemonEndpoints: endpoints,
			Capacity:        capacity, Allocatable: capacity.DeepCopy(),
			Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: a.cfg.AdvertiseAddr}, {Type: corev1.NodeHostName, Address: name}},
			Conditions: []corev1.NodeCondition{
				{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "AgentReady",
					Message: "skiff agent is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now},
				// The agent's own conditions, beside Ready, which the leader maintains from gossip.
				{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Reason: "AgentHasSufficientMemory",
					Message: "skiff agent has sufficient memory available", LastHeartbeatTime: now, LastTransitionTime: now},
				{Type: corev1.NodeDiskPressure, Status: corev1.ConditionFalse, Reason: "AgentHasNoDiskPressure",
					Message: "skiff agent has no disk pressure", LastHeartbeatTime: now, LastTransitionTime: now},
				{Type: corev1.NodePIDPressure, Status: corev1.ConditionFalse, Reason: "AgentHasSufficientPID",
					Message: "skiff agent has sufficient PID available", LastHeartbeatTime: now, LastTransitionTime: now},
				{Type: corev1.NodeNetworkUnavailable, Status: corev1.ConditionFalse, Reason: "RouteCreated",
					Message: "skiff agent's pod network is up", LastHeartbeatTime: now, LastTransitionTime: now},
			},
			NodeInfo: corev1.NodeSystemInfo{KernelVersion: host.kernel, OSImage: host.osImage, OperatingSystem: runtime.GOOS,
				Architecture: runtime.GOARCH, ContainerRuntimeVersion: a.runtime.Version(), KubeletVersion: "skiff"},
		},
	}
}

// runningContainers lists the containers that run on the node, as the pods' statuses say, with each pod's
// sandbox (no name), for the resource metrics.
func (a *Agent) runningContainers() []stats.Container {
	var out []stats.Container
	for _, obj := range a.pods.List() {
		pod := obj.(*corev1.Pod)
		if !a.nodes[pod.Spec.NodeName] || pod.Status.StartTime == nil {
			continue
		}
		out = append(out, stats.Container{Namespace: pod.Namespace, Pod: pod.Name, PodUID: string(pod.UID),
			ID: sandboxID(pod), StartTime: pod.Status.StartTime.Time})
		for _, list := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses, pod.Status.EphemeralContainerStatuses} {
			for _, c := range list {
				if c.State.Running == nil || c.ContainerID == "" {
					continue
				}
				out = append(out, stats.Container{Namespace: pod.Namespace, Pod: pod.Name, PodUID: string(pod.UID), Name: c.Name,
					ID: strings.TrimPrefix(c.ContainerID, "containerd://"), StartTime: c.State.Running.StartedAt.Time})
			}
		}
	}
	return out
}

// ErrVersionSkew means this agent's version may not join the servers' (internal/version's policy).
var ErrVersionSkew = errors.New("version skew")

// checkVersionSkew asks a server for its version and refuses to go on when this agent's may not join it:
// newer than the servers, or too far behind. A server too old to say its version is let be.
func (a *Agent) checkVersionSkew(ctx context.Context) error {
	data, err := a.client.CoreV1().RESTClient().Get().AbsPath(version.Path).DoRaw(ctx)
	if apierrors.IsNotFound(err) {
		a.logger.Warn("the server does not say its version; version skew not checked")
		return nil
	} else if err != nil {
		return fmt.Errorf("reading the servers' version: %w", err)
	}
	var info version.Info
	if err := json.Unmarshal(data, &info); err != nil {
		return fmt.Errorf("reading the servers' version: %w", err)
	}
	if err := version.CheckAgent(version.Version, info.Version); err != nil {
		return fmt.Errorf("%w: %v", ErrVersionSkew, err)
	}
	return nil
}
