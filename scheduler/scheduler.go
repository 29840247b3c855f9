package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	schedulinglisters "k8s.io/client-go/listers/scheduling/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/skiff-dev/skiff/internal/cachetransform"
)

// SchedulerName is the name pods give to be placed by this scheduler.
const SchedulerName = corev1.DefaultSchedulerName

// Config configures a Scheduler.
type Config struct {
	Client kubernetes.Interface
	// Informers, when set, is the informer factory the scheduler shares with the leader's other services;
	// else it builds its own on Client.
	Informers informers.SharedInformerFactory
	// InformersStarted, with Informers, is closed once the factory's owner has registered all it needs and
	// started it; Run starts the factory only after (the owner's handlers may not be ready for events before).
	InformersStarted <-chan struct{}
	Logger           hclog.Logger
	// Seed seeds the tie-breaking between equally scored nodes; 0 picks one from the clock.
	Seed int64
	// BindWorkers bounds the binds in flight (default 64).
	BindWorkers int
}

// Scheduler places pending pods; see the package documentation for the pipeline.
type Scheduler struct {
	client    kubernetes.Interface
	informers informers.SharedInformerFactory // nil: Run builds its own
	started   <-chan struct{}                 // with informers: when Run may start them
	logger    hclog.Logger
	rand      *rand.Rand
	cache     *Cache
	queue     *Queue
	recorder  record.EventRecorder

	preFilters []PreFilterPlugin
	filters    []FilterPlugin
	preScores  []PreScorePlugin
	scorers    []weightedScorer

	namespaces      corelisters.NamespaceLister
	priorityClasses schedulinglisters.PriorityClassLister
	claims          ClaimSource // nil until Run starts the informers

	nominated *nominator
	nextStart int // where the next search for feasible nodes begins, so that nodes take turns
	binds     chan struct{}
	inflight  sync.WaitGroup
}

// The plugins, in the order they run. Weights are Kubernetes' defaults.
var (
	filterPlugins = []FilterPlugin{
		nodeUnschedulable{}, nodeName{}, taintToleration{}, nodeAffinity{}, volumeBinding{},
		nodeResourcesFit{}, nodePorts{}, interPodAffinity{}, podTopologySpread{},
	}
	scorePlugins = []weightedScorer{
		{taintToleration{}, 3},
		{nodeAffinity{}, 2},
		{podTopologySpread{}, 2},
		{interPodAffinity{}, 2},
		{nodeResourcesFit{}, 1},
		{balancedAllocation{}, 1},
		{imageLocality{}, 1},
	}
)

// New builds a scheduler.
func New(cfg Config) *Scheduler {
	seed := cfg.Seed
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	if cfg.BindWorkers <= 0 {
		cfg.BindWorkers = 64
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	s := &Scheduler{
		client: cfg.Client, informers: cfg.Informers, started: cfg.InformersStarted, logger: cfg.Logger, rand: rand.New(rand.NewSource(seed)),
		cache: NewCache(), filters: filterPlugins, scorers: scorePlugins,
		binds: make(chan struct{}, cfg.BindWorkers), nominated: newNominator(),
	}
	s.queue = NewQueue(s.podPriority)
	seen := map[string]bool{}
	for _, p := range filterPlugins {
		if pf, ok := p.(PreFilterPlugin); ok && !seen[p.Name()] {
			s.preFilters = append(s.preFilters, pf)
			seen[p.Name()] = true
		}
	}
	for _, w := range scorePlugins {
		if ps, ok := w.plugin.(PreScorePlugin); ok {
			s.preScores = append(s.preScores, ps)
		}
	}
	return s
}

// Run schedules until ctx ends (the leader lost its leadership). It builds its cache from informers
// first, so that a new leader carries on where the old one stopped.
func (s *Scheduler) Run(ctx context.Context) error {
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: s.client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	s.recorder = broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: SchedulerName})

	factory := s.informers
	if factory == nil {
		// Managed fields are for apply; the scheduler never reads them, and at 50,000 pods they would be most
		// of its memory.
		factory = informers.NewSharedInformerFactoryWithOptions(s.client, 0, informers.WithTransform(cachetransform.StripManagedFields))
	}
	s.namespaces = factory.Core().V1().Namespaces().Lister()
	s.priorityClasses = factory.Scheduling().V1().PriorityClasses().Lister()
	if _, err := factory.Core().V1().Nodes().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.cache.SetNode(obj.(*corev1.Node)); s.queue.MoveAll() },
		UpdateFunc: func(_, obj any) { s.cache.SetNode(obj.(*corev1.Node)); s.queue.MoveAll() },
		DeleteFunc: func(obj any) {
			if node, ok := unwrap[*corev1.Node](obj); ok {
				s.cache.RemoveNode(node.Name)
			}
		},
	}); err != nil {
		return err
	}
	if _, err := factory.Core().V1().Pods().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.onPod(obj.(*corev1.Pod)) },
		UpdateFunc: func(_, obj any) { s.onPod(obj.(*corev1.Pod)) },
		DeleteFunc: func(obj any) {
			if pod, ok := unwrap[*corev1.Pod](obj); ok {
				s.nominated.set(pod, "")
				s.cache.RemovePod(pod.UID)
				s.queue.Delete(pod)
				if pod.Spec.NodeName != "" {
					s.queue.MoveAll() // its room is free
				}
			}
		},
	}); err != nil {
		return err
	}
	// A claim bound, a volume made or a class created may let a waiting pod with claims in.
	s.claims = informerClaims{factory.Core().V1().PersistentVolumeClaims().Lister(),
		factory.Core().V1().PersistentVolumes().Lister(), factory.Storage().V1().StorageClasses().Lister()}
	retry := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.queue.MoveAll() },
		UpdateFunc: func(_, _ any) { s.queue.MoveAll() },
	}
	for _, inf := range []cache.SharedIndexInformer{factory.Core().V1().PersistentVolumeClaims().Informer(),
		factory.Core().V1().PersistentVolumes().Informer(), factory.Storage().V1().StorageClasses().Informer()} {
		if _, err := inf.AddEventHandler(retry); err != nil {
			return err
		}
	}
	if s.started != nil {
		select {
		case <-s.started:
		case <-ctx.Done():
			return nil
		}
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	// Only its own: a shared factory holds the other services' informers too.
	for _, inf := range []cache.SharedIndexInformer{factory.Core().V1().Nodes().Informer(), factory.Core().V1().Pods().Informer(),
		factory.Core().V1().PersistentVolumeClaims().Informer(), factory.Core().V1().PersistentVolumes().Informer(),
		factory.Storage().V1().StorageClasses().Informer(), factory.Core().V1().Namespaces().Informer(),
		factory.Scheduling().V1().PriorityClasses().Informer()} {
		if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			return fmt.Errorf("the scheduler's informers did not sync")
		}
	}
	go s.queue.Run(ctx)
	s.logger.Info("scheduler started")
	for {
		qp := s.queue.Pop(ctx)
		if qp == nil {
			break
		}
		s.scheduleOne(ctx, qp)
	}
	s.inflight.Wait()
	return nil
}

func unwrap[T any](obj any) (T, bool) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	t, ok := obj.(T)
	return t, ok
}

// onPod routes a pod: bound pods occupy the cache; pending pods of this scheduler wait in the queue.
func (s *Scheduler) onPod(pod *corev1.Pod) {
	switch {
	case pod.Spec.NodeName != "":
		s.queue.Delete(pod)
		s.nominated.set(pod, "")
		s.cache.SetPod(pod)
		if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			s.queue.MoveAll()
		}
	case pod.DeletionTimestamp != nil || pod.Spec.SchedulerName != SchedulerName:
		s.queue.Delete(pod)
		s.nominated.set(pod, "")
	default:
		s.nominated.set(pod, pod.Status.NominatedNodeName) // also rebuilds the picture after a leader change
		s.queue.Add(pod)
	}
}

// podPriority is spec.priority, which admission resolves from priorityClassName; a pod stored before its
// class existed is looked up here.
func (s *Scheduler) podPriority(pod *corev1.Pod) int32 {
	if pod.Spec.Priority != nil {
		return *pod.Spec.Priority
	}
	if pod.Spec.PriorityClassName != "" && s.priorityClasses != nil {
		if pc, err := s.priorityClasses.Get(pod.Spec.PriorityClassName); err == nil {
			return pc.Value
		}
	}
	return 0
}

func (s *Scheduler) namespaceLabels(ns string) labels.Set {
	if s.namespaces == nil {
		return nil
	}
	n, err := s.namespaces.Get(ns)
	if err != nil {
		return nil
	}
	return n.Labels
}

// scheduleOne makes one decision and starts its bind.
func (s *Scheduler) scheduleOne(ctx context.Context, qp *queuedPod) {
	pod := s.queue.Pod(qp)
	if pod == nil {
		s.queue.Done(qp)
		return
	}
	info := NewPodInfo(pod)
	snap := s.cache.Snapshot()
	host, fitErr := s.decide(ctx, info, snap)
	var candidate *preemptionCandidate
	nominated := ""
	if fitErr != nil {
		candidate, nominated = s.findPreemption(ctx, info, snap, fitErr)
	}
	snap.Release() // before any API call: informer updates wait for the read lock
	if fitErr != nil {
		if candidate != nil {
			nominated = candidate.node
			s.nominated.set(pod, nominated) // the room is the pod's from now, before the informer says so
			s.preempt(ctx, pod, candidate)
		}
		s.queue.Unschedulable(qp)
		s.recordFailure(ctx, pod, fitErr, nominated)
		return
	}
	if err := s.cache.Assume(info, host); err != nil {
		// Already bound or assumed: an earlier decision for the same pod is being stored.
		s.queue.Done(qp)
		return
	}
	s.queue.Done(qp)
	s.goBounded(ctx, func() { s.bind(ctx, qp, info, host) })
}

// goBounded runs f in its own goroutine once one of the BindWorkers slots is free, or not at all once ctx
// ends. Run waits for every such goroutine before it returns.
func (s *Scheduler) goBounded(ctx context.Context, f func()) {
	select {
	case s.binds <- struct{}{}:
	case <-ctx.Done():
		return
	}
	s.inflight.Add(1)
	go func() {
		defer func() { <-s.binds; s.inflight.Done() }()
		f()
	}()
}

// FitError says why a pod fitted no node: each node's rejection.
type FitError struct {
	NumNodes int
	// Reasons counts the nodes rejected for each reason.
	Reasons map[string]int
	// Statuses is each rejected node's status, for preemption.
	Statuses map[string]*Status
}

// Error is Kubernetes' aggregate: "0/5 nodes are available: 2 Insufficient cpu, 3 node(s) didn't match
// Pod's node affinity/selector."
func (e *FitError) Error() string {
	if e.NumNodes == 0 {
		return "no nodes available to schedule pods"
	}
	var parts []string
	for reason, n := range e.Reasons {
		parts = append(parts, fmt.Sprintf("%d %s", n, reason))
	}
	sort.Strings(parts)
	return fmt.Sprintf("0/%d nodes are available: %s.", e.NumNodes, strings.Join(parts, ", "))
}

// decide filters and scores the nodes and returns the chosen one, or the reasons none fits.
func (s *Scheduler) decide(ctx context.Context, info *PodInfo, snap *Snapshot) (string, *FitError) {
	pod := info.Pod
	nodes := snap.Nodes
	state := NewCycleState(info, s.namespaceLabels)
	state.NodeCount, state.ImageNodes, state.allNodes, state.podIndex = len(nodes), snap.ImageNodes, nodes, snap
	if s.claims != nil {
		state.Claims = s.claims
	}
	state.nominated = s.nominated.ahead(pod, s.podPriority(pod), s.podPriority)
	fitErr := &FitError{NumNodes: len(nodes), Reasons: map[string]int{}, Statuses: map[string]*Status{}}
	if len(nodes) == 0 {
		return "", fitErr
	}
	for _, p := range s.preFilters {
		if st := p.PreFilter(ctx, state, pod, nodes); !st.IsSuccess() {
			for _, n := range nodes {
				fitErr.Statuses[n.Name()] = st
			}
			for _, r := range st.Reasons() {
				fitErr.Reasons[r] = len(nodes)
			}
			return "", fitErr
		}
	}
	// A nominated node (from an earlier preemption) is tried first, so the pod lands where room was made.
	if nominated := pod.Status.NominatedNodeName; nominated != "" {
		if n := snap.Node(nominated); n != nil && s.filterWithNominated(ctx, state, pod, n).IsSuccess() {
			return nominated, nil
		}
	}
	// A pod pinned to named nodes (a daemon pod) is filtered on those alone; the others fail node affinity.
	if names := pinnedNodeNames(pod); names != nil {
		var pinned []*NodeInfo
		for _, name := range names {
			if n := snap.Node(name); n != nil {
				pinned = append(pinned, n)
			}
		}
		if skipped := len(nodes) - len(pinned); skipped > 0 {
			fitErr.Reasons[nodeAffinityMismatch] += skipped
		}
		if nodes = pinned; len(nodes) == 0 {
			return "", fitErr
		}
	}
	feasible := s.findFeasible(ctx, state, pod, nodes, fitErr)
	if len(feasible) == 0 {
		return "", fitErr
	}
	if len(feasible) == 1 {
		return feasible[0].Name(), nil
	}
	return s.selectHost(s.score(ctx, state, pod, feasible)), nil
}

// numFeasibleToFind is how many feasible nodes are enough to pick from, Kubernetes' adaptive rule: all
// nodes in small clusters, a share falling from 50% toward 5% of large ones, at least 100.
func numFeasibleToFind(total int) int {
	if total < 100 {
		return total
	}
	percent := max(50-total/125, 5)
	return max(total*percent/100, 100)
}

func (s *Scheduler) findFeasible(ctx context.Context, state *CycleState, pod *corev1.Pod, nodes []*NodeInfo, fitErr *FitError) []*NodeInfo {
	want := numFeasibleToFind(len(nodes))
	var feasible []*NodeInfo
	start := s.nextStart % len(nodes)
	checked := 0
	for ; checked < len(nodes) && len(feasible) < want; checked++ {
		n := nodes[(start+checked)%len(nodes)]
		st := s.filterWithNominated(ctx, state, pod, n)
		if st.IsSuccess() {
			feasible = append(feasible, n)
			continue
		}
		fitErr.Statuses[n.Name()] = st
		for _, r := range st.Reasons() {
			fitErr.Reasons[r]++
		}
	}
	s.nextStart = start + checked
	return feasible
}

// runFilters runs the filters in order and stops at the first rejection.
func (s *Scheduler) runFilters(ctx context.Context, state *CycleState, pod *corev1.Pod, n *NodeInfo) *Status {
	for _, f := range s.filters {
		if st := f.Filter(ctx, state, pod, n); !st.IsSuccess() {
			return st
		}
	}
	return nil
}

// score sums the weighted, normalized scores of every plugin for each feasible node.
func (s *Scheduler) score(ctx context.Context, state *CycleState, pod *corev1.Pod, feasible []*NodeInfo) []NodeScore {
	for _, p := range s.preScores {
		if st := p.PreScore(ctx, state, pod, feasible); !st.IsSuccess() {
			s.logger.Warn("prescore failed", "plugin", p.Name(), "status", st)
		}
	}
	total := make([]NodeScore, len(feasible))
	scores := make([]NodeScore, len(feasible))
	for i, n := range feasible {
		total[i].Name = n.Name()
	}
	for _, w := range s.scorers {
		for i, n := range feasible {
			v, st := w.plugin.Score(ctx, state, pod, n)
			if !st.IsSuccess() {
				v = 0
			}
			scores[i] = NodeScore{Name: n.Name(), Score: v}
		}
		if norm, ok := w.plugin.(ScoreNormalizer); ok {
			norm.NormalizeScore(ctx, state, pod, scores)
		}
		for i := range scores {
			total[i].Score += min(max(scores[i].Score, 0), MaxNodeScore) * w.weight
		}
	}
	return total
}

// selectHost picks the highest score, breaking ties uniformly at random (reservoir sampling).
func (s *Scheduler) selectHost(scores []NodeScore) string {
	best, ties := scores[0], 1
	for _, sc := range scores[1:] {
		switch {
		case sc.Score > best.Score:
			best, ties = sc, 1
		case sc.Score == best.Score:
			ties++
			if s.rand.Intn(ties) == 0 {
				best = sc
			}
		}
	}
	return best.Name
}

// bind stores the decision through the binding subresource. A failure forgets the assumption and
// requeues the pod with backoff.
func (s *Scheduler) bind(ctx context.Context, qp *queuedPod, info *PodInfo, host string) {
	pod := info.Pod
	if err := s.annotateSelectedNode(ctx, pod, host); err != nil {
		s.cache.Forget(pod.UID)
		s.logger.Warn("selecting the node of the pod's volumes failed", "pod", qp.key, "node", host, "error", err)
		s.recorder.Eventf(pod, corev1.EventTypeWarning, "FailedScheduling", "Selecting node %s for the pod's volumes: %v", host, err)
		s.queue.Backoff(qp)
		return
	}
	binding := &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: host},
	}
	err := s.client.CoreV1().Pods(pod.Namespace).Bind(ctx, binding, metav1.CreateOptions{})
	if err != nil {
		s.cache.Forget(pod.UID)
		if apierrors.IsNotFound(err) || isAlreadyBound(err) || errors.Is(err, context.Canceled) {
			return // deleted, or bound already (by an earlier leader): nothing to retry
		}
		s.logger.Warn("bind failed", "pod", qp.key, "node", host, "error", err)
		s.recorder.Eventf(pod, corev1.EventTypeWarning, "FailedScheduling", "Binding rejected: %v", err)
		s.queue.Backoff(qp)
		return
	}
	s.recorder.Eventf(pod, corev1.EventTypeNormal, "Scheduled", "Successfully assigned %s/%s to %s", pod.Namespace, pod.Name, host)
}

func isAlreadyBound(err error) bool {
	return apierrors.IsConflict(err) && strings.Contains(err.Error(), "already assigned")
}

// recordFailure emits FailedScheduling and sets the PodScheduled=False condition with the same message,
// plus nominatedNodeName when preemption made room.
func (s *Scheduler) recordFailure(ctx context.Context, pod *corev1.Pod, fitErr *FitError, nominated string) {
	msg := fitErr.Error()
	s.recorder.Event(pod, corev1.EventTypeWarning, "FailedScheduling", msg)
	cond := corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable, Message: msg}
	if current := podCondition(pod, corev1.PodScheduled); current != nil && current.Status == cond.Status &&
		current.Reason == cond.Reason && current.Message == cond.Message && nominated == "" {
		return // unchanged: spare the store a write
	}
	s.goBounded(ctx, func() { s.patchStatus(ctx, pod, cond, nominated) })
}

func podCondition(pod *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == t {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}

// patchStatus writes the condition (a strategic merge keyed by condition type) and the nominated node.
func (s *Scheduler) patchStatus(ctx context.Context, pod *corev1.Pod, cond corev1.PodCondition, nominated string) {
	cond.LastTransitionTime = metav1.Now()
	status := map[string]any{"conditions": []corev1.PodCondition{cond}}
	if nominated != "" {
		status["nominatedNodeName"] = nominated
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"uid": pod.UID}, "status": status})
	_, err := s.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	if err != nil && !apierrors.IsNotFound(err) && !errors.Is(err, context.Canceled) {
		s.logger.Warn("updating pod condition", "pod", pod.Namespace+"/"+pod.Name, "error", err)
	}
}
