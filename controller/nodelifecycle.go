package controller

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	coordinationlisters "k8s.io/client-go/listers/coordination/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/skiff-dev/skiff/gossip"
)

// Members is the gossip pool as the node lifecycle controller reads it.
type Members interface {
	Members() []gossip.Member
	SuspicionTimeout() time.Duration
	Subscribe() (<-chan gossip.Event, func())
	// Reachable says whether the member answers a direct probe now.
	Reachable(name string) bool
}

// NodeLifecycleConfig tunes the node lifecycle controller (server HCL keys in parentheses).
type NodeLifecycleConfig struct {
	// LeaseGrace is how stale a Node's Lease may be before a Node that no gossip member hosts is unreachable
	// (node_lease_grace, 40 s).
	LeaseGrace time.Duration
	// PodGCTimeout is how long pods stay Terminating on a Node that is gone before they are force-deleted
	// (pod_gc_timeout, 10 min).
	PodGCTimeout time.Duration
}

// The taints the controller manages, as Kubernetes names them.
const (
	taintUnreachable = "node.kubernetes.io/unreachable"
	taintNotReady    = "node.kubernetes.io/not-ready"
)

// nodeHealth is what the controller concludes about one Node.
type nodeHealth int

const (
	healthUntracked   nodeHealth = iota // no gossip member and no Lease: left as its writer set it
	healthReady                         // its member is alive (or its Lease is fresh)
	healthUnreachable                   // its member failed (or its Lease went stale): Ready=Unknown
	healthShutdown                      // its member left gracefully: Ready=False
)

// judgeNode decides a Node's health: by the gossip member that hosts it when there is one, else by its
// Lease in kube-node-lease.
func judgeNode(member *gossip.Member, lease *coordinationv1.Lease, now time.Time, grace time.Duration) nodeHealth {
	if member != nil {
		switch member.Status {
		case gossip.StatusAlive:
			return healthReady
		case gossip.StatusLeft:
			return healthShutdown
		default:
			return healthUnreachable
		}
	}
	if lease == nil || lease.Spec.RenewTime == nil {
		return healthUntracked
	}
	if now.Sub(lease.Spec.RenewTime.Time) > grace {
		return healthUnreachable
	}
	return healthReady
}

// wantReady is the Ready condition a Node should carry in each state; nil leaves the condition alone.
func wantReady(h nodeHealth) *corev1.NodeCondition {
	switch h {
	case healthReady:
		return &corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "AgentReady", Message: "skiff agent is posting ready status"}
	case healthUnreachable:
		return &corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Reason: "NodeStatusUnknown", Message: "Kubelet stopped posting node status."}
	case healthShutdown:
		return &corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: "NodeShutdown", Message: "The node agent left the cluster gracefully."}
	}
	return nil
}

// wantTaintKey is the health taint a Node should carry (NoSchedule and NoExecute), or "" for none.
func wantTaintKey(h nodeHealth) string {
	switch h {
	case healthUnreachable:
		return taintUnreachable
	case healthShutdown:
		return taintNotReady
	}
	return ""
}

// withHealthTaints returns the Node's taints with the health taints set to key (none when key is ""), and
// whether they changed. A NoExecute taint records when it was added: tolerationSeconds count from then.
func withHealthTaints(taints []corev1.Taint, key string, now time.Time) ([]corev1.Taint, bool) {
	var out []corev1.Taint
	have := map[corev1.TaintEffect]bool{}
	changed := false
	for _, t := range taints {
		switch {
		case (t.Key == taintUnreachable || t.Key == taintNotReady) && t.Key != key:
			changed = true // a health taint that no longer applies
			continue
		case t.Key == key && key != "":
			have[t.Effect] = true
			if t.Effect == corev1.TaintEffectNoExecute && t.TimeAdded == nil {
				// tolerationSeconds count from TimeAdded; a taint without one would never run out.
				added := metav1.NewTime(now)
				t.TimeAdded, changed = &added, true
			}
		}
		out = append(out, t)
	}
	if key != "" {
		for _, effect := range []corev1.TaintEffect{corev1.TaintEffectNoSchedule, corev1.TaintEffectNoExecute} {
			if have[effect] {
				continue
			}
			t := corev1.Taint{Key: key, Effect: effect}
			if effect == corev1.TaintEffectNoExecute {
				added := metav1.NewTime(now)
				t.TimeAdded = &added
			}
			out = append(out, t)
			changed = true
		}
	}
	return out, changed
}

// evictAt is when a pod must leave a Node with this NoExecute taint, added at added: now without a matching
// toleration, never (zero time, false) with one that has no tolerationSeconds, else when its
// tolerationSeconds run out.
func evictAt(pod *corev1.Pod, taint corev1.Taint, added, now time.Time) (time.Time, bool) {
	for _, tol := range pod.Spec.Tolerations {
		if !tol.ToleratesTaint(klog.Background(), &taint, false) {
			continue
		}
		if tol.TolerationSeconds == nil {
			return time.Time{}, false
		}
		return added.Add(time.Duration(max(*tol.TolerationSeconds, 0)) * time.Second), true
	}
	return now, true
}

// taintAddedAt is when a Node's NoExecute taint was added: its TimeAdded, which the health taints always
// carry; for a taint without one (`kubectl taint ... :NoExecute`), when this leader first saw it, as
// Kubernetes' taint eviction controller counts.
func (l *lifecycle) taintAddedAt(node string, t corev1.Taint, now time.Time) time.Time {
	if t.TimeAdded != nil {
		return t.TimeAdded.Time
	}
	key := node + "\x00" + t.Key + "=" + t.Value
	seen, ok := l.taintSeen[key]
	if !ok {
		l.taintSeen[key], seen = now, now
	}
	l.taintPresent[key] = true
	return seen
}

// runNodeLifecycle turns gossip member state (or Lease freshness) into Node conditions and taints, and evicts
// pods from unreachable Nodes when their tolerations run out.
//  1. Each second, judge every Node: member alive, failed or left; or, with no member, its Lease. A failed
//     member counts only once a direct probe from this server fails too (rechecked every 10 s).
//  2. Set its Ready condition and health taints (unreachable or not-ready, NoSchedule and NoExecute).
//  3. Mark the pods of unreachable or shut-down Nodes not Ready, so endpoints drop them.
//  4. Evict (graceful delete) pods whose tolerations of the NoExecute taint ran out, unless more than half of
//     the tracked Nodes are unreachable at once: then the control plane's own network is the likelier
//     culprit, and nothing is evicted (Kubernetes' full-disruption mode).
//  5. Force-delete pods stuck Terminating on such Nodes for pod_gc_timeout, and pods whose Node is gone.
//
// A new leader inherits a view it did not watch form: it marks nothing unreachable and evicts nothing until
// a full gossip suspicion interval has passed. That view may be stale besides: a server that was cut off
// holds every member as failed until it reconnects, and may lead as soon as the partition heals; the probe
// of step 1 is what keeps it from marking live nodes unreachable.
func runNodeLifecycle(ctx context.Context, c *Clients) {
	if c.Members == nil {
		c.Logger.Info("no gossip pool: node lifecycle off")
		return
	}
	cfg := c.NodeLifecycle
	if cfg.LeaseGrace <= 0 {
		cfg.LeaseGrace = 40 * time.Second
	}
	if cfg.PodGCTimeout <= 0 {
		cfg.PodGCTimeout = 10 * time.Minute
	}
	nodes := c.Informers.Core().V1().Nodes()
	pods := c.Informers.Core().V1().Pods()
	leases := c.Informers.Coordination().V1().Leases()
	c.Informers.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), nodes.Informer().HasSynced, pods.Informer().HasSynced, leases.Informer().HasSynced) {
		return
	}
	l := &lifecycle{c: c, cfg: cfg, nodes: nodes.Lister(), podIndex: pods.Informer().GetIndexer(), leases: leases.Lister(),
		warmAt: time.Now().Add(c.Members.SuspicionTimeout() + time.Second), orphanSince: map[string]time.Time{},
		failureConfirmed: map[string]time.Time{}, answering: map[string]bool{}, podWriter: newPodWriter(ctx)}
	// Member changes trigger a pass at once (after a short pause that gathers a burst of them), so detection
	// is not held back by the tick; the tick catches Leases, tolerations running out and anything missed.
	events, unsubscribe := c.Members.Subscribe()
	defer func() { unsubscribe() }()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		l.reconcile(ctx, time.Now())
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case _, open := <-events:
			if !open { // cut off for falling behind: resubscribe; this pass rereads the whole pool anyway
				events, unsubscribe = c.Members.Subscribe()
			}
			time.Sleep(memberEventBatch)
			drain(events)
		}
	}
}

// drain empties the channel without blocking.
func drain(events <-chan gossip.Event) {
	for {
		select {
		case _, open := <-events:
			if !open {
				return
			}
		default:
			return
		}
	}
}

// memberEventBatch is how long a member change waits for others before the pass it triggers.
const memberEventBatch = 50 * time.Millisecond

type lifecycle struct {
	c           *Clients
	cfg         NodeLifecycleConfig
	nodes       corelisters.NodeLister
	podIndex    cache.Indexer
	leases      coordinationlisters.LeaseLister
	warmAt      time.Time
	disrupted   bool
	orphanSince map[string]time.Time // pods whose Node is gone, by namespace/name
	// failureConfirmed is when a direct probe last failed to reach a member this server's gossip view holds
	// as failed, by member name.
	failureConfirmed map[string]time.Time
	answering        map[string]bool // failed members that answered their last probe, logged once
	// taintSeen is when this leader first saw each NoExecute taint without a TimeAdded, by node, key and value;
	// taintPresent the ones the current pass saw.
	taintSeen    map[string]time.Time
	taintPresent map[string]bool
	podWriter    *podWriter // nil: a pass makes its pod writes itself (unit tests)
}

// failureRecheck is how long a confirmed failure stands before the member is probed again.
const failureRecheck = 10 * time.Second

// confirmFailures probes, all at once, the failed members whose failure has not been confirmed within
// failureRecheck, and keeps the result in l.failureConfirmed. A member is acted on as failed only while its
// failure is confirmed: this server's view can be stale, above all on a server that was itself cut off and
// now leads, which holds every member as failed until it reconnects; a member it can reach is not failed.
func (l *lifecycle) confirmFailures(hosts map[string]*gossip.Member, now time.Time) {
	failed := map[string]bool{}
	var probe []string
	probing := map[string]bool{}
	for _, m := range hosts {
		if m.Status != gossip.StatusDead || probing[m.Name] {
			continue
		}
		failed[m.Name], probing[m.Name] = true, true
		if at, ok := l.failureConfirmed[m.Name]; !ok || now.Sub(at) >= failureRecheck {
			probe = append(probe, m.Name)
		}
	}
	for name := range l.failureConfirmed {
		if !failed[name] {
			delete(l.failureConfirmed, name)
		}
	}
	for name := range l.answering {
		if !failed[name] {
			delete(l.answering, name)
		}
	}
	reachable := make([]bool, len(probe))
	var wg sync.WaitGroup
	for i, name := range probe {
		wg.Go(func() { reachable[i] = l.c.Members.Reachable(name) })
	}
	wg.Wait()
	for i, name := range probe {
		if !reachable[i] {
			l.failureConfirmed[name] = now
			delete(l.answering, name)
			continue
		}
		if !l.answering[name] {
			l.c.Logger.Info("a member this server holds as failed answers a direct probe: its nodes are left alone until gossip agrees", "member", name)
		}
		l.answering[name] = true
		delete(l.failureConfirmed, name)
	}
}

// reconcile is one pass of the steps runNodeLifecycle lists.
func (l *lifecycle) reconcile(ctx context.Context, now time.Time) {
	hosts := map[string]*gossip.Member{}
	for _, m := range l.c.Members.Members() {
		for _, name := range m.Meta.HostedNodes() {
			// An alive member wins over a dead one that hosted the same Node before.
			if prev := hosts[name]; prev == nil || prev.Status != gossip.StatusAlive {
				hosts[name] = &m
			}
		}
	}
	nodes, err := l.nodes.List(labels.Everything())
	if err != nil {
		return
	}
	l.confirmFailures(hosts, now)
	health := make(map[string]nodeHealth, len(nodes))
	tracked, unreachable := 0, 0
	for _, node := range nodes {
		lease, _ := l.leases.Leases(corev1.NamespaceNodeLease).Get(node.Name)
		member := hosts[node.Name]
		h := judgeNode(member, lease, now, l.cfg.LeaseGrace)
		if h == healthUnreachable && now.Before(l.warmAt) {
			continue // a new leader's inherited view: not yet
		}
		if h == healthUnreachable && member != nil {
			if _, confirmed := l.failureConfirmed[member.Name]; !confirmed {
				continue // this server's view is stale: the member answers
			}
		}
		health[node.Name] = h
		if h != healthUntracked {
			tracked++
		}
		if h == healthUnreachable {
			unreachable++
		}
	}
	disrupted := tracked > 1 && unreachable*2 > tracked
	restamp := false
	if disrupted != l.disrupted {
		l.disrupted = disrupted
		restamp = !disrupted
		if disrupted {
			l.c.Logger.Warn("more than half of the nodes are unreachable at once: suspecting the control plane's own network, evictions stopped (full-disruption mode)",
				"unreachable", unreachable, "tracked", tracked)
		} else {
			l.c.Logger.Info("leaving full-disruption mode: evictions resume", "unreachable", unreachable, "tracked", tracked)
		}
	}
	l.taintPresent = map[string]bool{}
	if l.taintSeen == nil {
		l.taintSeen = map[string]time.Time{}
	}
	// Every Node's health is written first, in parallel, and the pass waits for those writes; the pods' writes
	// go to the background writer. A dead gossip member takes its Nodes down together: at hundreds of Nodes,
	// one at a time, each followed by its pods, the last Node of a dead member was marked a minute after the
	// first, and a pass that waited for the pods held the next dead member's Nodes back for 25 s.
	var writes []healthWrite
	var podWrites []podWrite
	for _, node := range nodes {
		h, judged := health[node.Name]
		if !judged || (h != healthUnreachable && h != healthShutdown) {
			podWrites = append(podWrites, l.userTaintEvictions(node, now)...)
		}
		if !judged || h == healthUntracked {
			continue
		}
		// Leaving full disruption, tolerations count afresh from now, as Kubernetes re-taints its nodes, rather
		// than from before the disruption, which would evict everything at once.
		if restamp := restamp && h == healthUnreachable; restamp || l.healthDiffers(node, h, now) {
			writes = append(writes, healthWrite{node: node, health: h, restamp: restamp})
		}
		if h == healthUnreachable || h == healthShutdown {
			// No evictions in the pass that restamps: the node here still carries the old taint times.
			podWrites = append(podWrites, l.lostNodePodWrites(node, now, disrupted || restamp)...)
		}
	}
	if len(writes) > 0 {
		start := time.Now()
		conditions := l.writeHealth(ctx, writes, now)
		// When a member failed, how long its Nodes took after the verdict: the pass's own share (from now, the
		// time the pass began), the Ready conditions' writes and all the writes'.
		l.c.Logger.Info("node health written", "nodes", len(writes), "pass", start.Sub(now).Round(time.Millisecond),
			"conditions", conditions.Round(time.Millisecond), "writes", time.Since(start).Round(time.Millisecond))
	}
	l.writePods(ctx, podWrites)
	for key := range l.taintSeen {
		if !l.taintPresent[key] {
			delete(l.taintSeen, key) // removed: a taint added again counts afresh
		}
	}
	l.collectOrphans(ctx, nodes, now)
}

// restampNoExecute returns a copy of the node whose health NoExecute taints were added now.
func restampNoExecute(node *corev1.Node, now time.Time) *corev1.Node {
	out := node.DeepCopy()
	for i, t := range out.Spec.Taints {
		if t.Effect == corev1.TaintEffectNoExecute && (t.Key == taintUnreachable || t.Key == taintNotReady) {
			added := metav1.NewTime(now)
			out.Spec.Taints[i].TimeAdded = &added
		}
	}
	return out
}

// readyDiffers says whether the Node's Ready condition differs from what h asks.
func readyDiffers(node *corev1.Node, h nodeHealth) bool {
	want := wantReady(h)
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status != want.Status || c.Reason != want.Reason
		}
	}
	return true
}

// healthDiffers says whether setNodeHealth has anything to write for the Node.
func (l *lifecycle) healthDiffers(node *corev1.Node, h nodeHealth, now time.Time) bool {
	_, taintsChange := withHealthTaints(node.Spec.Taints, wantTaintKey(h), now)
	return taintsChange || readyDiffers(node, h)
}

// healthWrite is a Node whose health a pass writes.
type healthWrite struct {
	node    *corev1.Node
	health  nodeHealth
	restamp bool // set the health NoExecute taints' TimeAdded to now
}

// writeHealth writes the Nodes' Ready conditions, every one of them first, then their health taints, and
// returns how long the conditions took. The condition is what says a failed member's Nodes are down
// (Ready=Unknown); when each writer wrote a Node's taints right after its condition, the last Nodes of a
// dead member waited for the taints of the first. A Node whose condition could not be written keeps its
// taints until the next pass.
func (l *lifecycle) writeHealth(ctx context.Context, writes []healthWrite, now time.Time) time.Duration {
	start := time.Now()
	written := make([]*corev1.Node, len(writes))
	inParallel(ctx, len(writes), func(i int) {
		node, err := l.setNodeReady(ctx, writes[i].node, writes[i].health, now)
		if err != nil {
			if ctx.Err() == nil {
				l.c.Logger.Warn("updating node health", "node", writes[i].node.Name, "error", err)
			}
			return
		}
		written[i] = node
	})
	conditions := time.Since(start)
	inParallel(ctx, len(writes), func(i int) {
		if written[i] == nil {
			return
		}
		if err := l.setNodeTaints(ctx, written[i], writes[i].health, now, writes[i].restamp); err != nil && ctx.Err() == nil {
			l.c.Logger.Warn("updating node health taints", "node", written[i].Name, "error", err)
		}
	})
	return conditions
}

// setNodeReady writes the Node's Ready condition when it differs from what h asks, and returns the Node as
// it is now.
func (l *lifecycle) setNodeReady(ctx context.Context, node *corev1.Node, h nodeHealth, now time.Time) (*corev1.Node, error) {
	want := wantReady(h)
	if readyDiffers(node, h) {
		updated := node.DeepCopy()
		cond := *want
		cond.LastTransitionTime, cond.LastHeartbeatTime = metav1.NewTime(now), metav1.NewTime(now)
		replaced := false
		for i := range updated.Status.Conditions {
			if updated.Status.Conditions[i].Type == corev1.NodeReady {
				updated.Status.Conditions[i], replaced = cond, true
			}
		}
		if !replaced {
			updated.Status.Conditions = append(updated.Status.Conditions, cond)
		}
		var err error
		if node, err = l.c.Kube.CoreV1().Nodes().UpdateStatus(ctx, updated, metav1.UpdateOptions{}); err != nil {
			return nil, err
		}
		l.c.Logger.Info("node health changed", "node", node.Name, "ready", want.Status, "reason", want.Reason)
	}
	return node, nil
}

// setNodeTaints writes the Node's health taints when they differ from what h asks; restamp sets the health
// NoExecute taints' TimeAdded to now.
func (l *lifecycle) setNodeTaints(ctx context.Context, node *corev1.Node, h nodeHealth, now time.Time, restamp bool) error {
	if restamp {
		node = restampNoExecute(node, now)
	}
	taints, changed := withHealthTaints(node.Spec.Taints, wantTaintKey(h), now)
	if !changed && !restamp {
		return nil
	}
	updated := node.DeepCopy()
	updated.Spec.Taints = taints
	_, err := l.c.Kube.CoreV1().Nodes().Update(ctx, updated, metav1.UpdateOptions{})
	return err
}

// lifecycleWriters is how many API writes a pass has in flight at once, as Kubernetes' node lifecycle
// controller updates Nodes with several workers.
const lifecycleWriters = 16

// inParallel calls write(i) for i in [0, n), lifecycleWriters at a time, and returns when all are done.
func inParallel(ctx context.Context, n int, write func(i int)) {
	workqueue.ParallelizeUntil(ctx, lifecycleWriters, n, write)
}

// runWrites runs a pass's writes, lifecycleWriters at a time, and returns when all are done.
func runWrites(ctx context.Context, writes []func(context.Context)) {
	inParallel(ctx, len(writes), func(i int) { writes[i](ctx) })
}

// podWrite is one write to a pod that a pass decided on; key names the pod and what is done to it.
type podWrite struct {
	key string
	do  func(context.Context)
}

func newPodWrite(what string, pod *corev1.Pod, do func(context.Context)) podWrite {
	return podWrite{key: what + "/" + pod.Namespace + "/" + pod.Name, do: do}
}

// writePods hands a pass's pod writes to the background writer, or, without one (unit tests), runs them
// before it returns.
func (l *lifecycle) writePods(ctx context.Context, writes []podWrite) {
	if l.podWriter != nil {
		for _, w := range writes {
			l.podWriter.add(w)
		}
		return
	}
	do := make([]func(context.Context), len(writes))
	for i, w := range writes {
		do[i] = w.do
	}
	runWrites(ctx, do)
}

// podWriter runs the pod writes of the passes in the background, lifecycleWriters at a time, so that a pass
// never waits for the pods of the Nodes it lost: at 500 nodes the 1,500 pods of one dead member took 25 s to
// mark not Ready, and the Nodes of the next member to die waited for them. A write queued again before it
// ran (the next pass saw the same pod unchanged) replaces the queued one rather than adding a second.
type podWriter struct {
	queue  workqueue.TypedInterface[string]
	mu     sync.Mutex
	writes map[string]func(context.Context)
}

// newPodWriter starts a writer that stops when ctx ends.
func newPodWriter(ctx context.Context) *podWriter {
	w := &podWriter{queue: workqueue.NewTyped[string](), writes: map[string]func(context.Context){}}
	for range lifecycleWriters {
		go w.work(ctx)
	}
	context.AfterFunc(ctx, w.queue.ShutDown)
	return w
}

func (w *podWriter) add(pw podWrite) {
	w.mu.Lock()
	w.writes[pw.key] = pw.do
	w.mu.Unlock()
	w.queue.Add(pw.key)
}

func (w *podWriter) work(ctx context.Context) {
	for {
		key, shutdown := w.queue.Get()
		if shutdown {
			return
		}
		w.mu.Lock()
		do := w.writes[key]
		delete(w.writes, key)
		w.mu.Unlock()
		// A shut-down queue still hands out what it holds: once leadership ended, drop it (each write would
		// only fail on the cancelled context); the next leader's passes decide again.
		if do != nil && ctx.Err() == nil {
			do(ctx)
		}
		w.queue.Done(key)
	}
}

// lostNodePodWrites returns the writes for a lost Node's pods: mark them not Ready, evict those whose
// tolerations ran out (unless disrupted), and force-delete those Terminating for longer than pod_gc_timeout:
// their agent will never confirm.
func (l *lifecycle) lostNodePodWrites(node *corev1.Node, now time.Time, disrupted bool) []podWrite {
	objs, _ := l.podIndex.ByIndex(podsByNode, node.Name)
	noExecute := l.noExecuteTaints(node, func(corev1.Taint) bool { return true }, now)
	var writes []podWrite
	for _, obj := range objs {
		pod := obj.(*corev1.Pod)
		if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		if pod.DeletionTimestamp != nil {
			if now.Sub(pod.DeletionTimestamp.Time) > l.cfg.PodGCTimeout {
				writes = append(writes, newPodWrite("delete", pod, func(ctx context.Context) { l.forceDelete(ctx, pod, "its node "+node.Name+" is gone") }))
			}
			continue
		}
		if podReadyNotFalse(pod) {
			writes = append(writes, newPodWrite("unready", pod, func(ctx context.Context) { l.markNotReady(ctx, pod, now) }))
		}
		if disrupted {
			continue
		}
		if taint, due := dueTaint(pod, noExecute, now); due {
			writes = append(writes, newPodWrite("evict", pod, func(ctx context.Context) { l.evict(ctx, pod, taint) }))
		}
	}
	return writes
}

// addedTaint is a NoExecute taint of a Node with when it was added.
type addedTaint struct {
	corev1.Taint
	added time.Time
}

// noExecuteTaints returns the Node's NoExecute taints that keep says to, each with when it was added.
func (l *lifecycle) noExecuteTaints(node *corev1.Node, keep func(corev1.Taint) bool, now time.Time) []addedTaint {
	var out []addedTaint
	for _, t := range node.Spec.Taints {
		if t.Effect == corev1.TaintEffectNoExecute && keep(t) {
			out = append(out, addedTaint{t, l.taintAddedAt(node.Name, t, now)})
		}
	}
	return out
}

// dueTaint returns the first of the NoExecute taints whose toleration by the pod ran out.
func dueTaint(pod *corev1.Pod, taints []addedTaint, now time.Time) (corev1.Taint, bool) {
	for _, t := range taints {
		if at, evict := evictAt(pod, t.Taint, t.added, now); evict && !now.Before(at) {
			return t.Taint, true
		}
	}
	return corev1.Taint{}, false
}

// userTaintEvictions returns, for a Node that is not lost, the evictions of the pods whose tolerations of
// its other NoExecute taints (a user's, not the health ones) ran out, as Kubernetes' taint eviction
// controller does on any Node.
func (l *lifecycle) userTaintEvictions(node *corev1.Node, now time.Time) []podWrite {
	noExecute := l.noExecuteTaints(node, func(t corev1.Taint) bool { return t.Key != taintUnreachable && t.Key != taintNotReady }, now)
	if len(noExecute) == 0 {
		return nil
	}
	var writes []podWrite
	objs, _ := l.podIndex.ByIndex(podsByNode, node.Name)
	for _, obj := range objs {
		pod := obj.(*corev1.Pod)
		if pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		if taint, due := dueTaint(pod, noExecute, now); due {
			writes = append(writes, newPodWrite("evict", pod, func(ctx context.Context) { l.evict(ctx, pod, taint) }))
		}
	}
	return writes
}

// podReadyNotFalse says whether the pod's Ready condition is anything but False: what marking it not Ready changes.
func podReadyNotFalse(pod *corev1.Pod) bool {
	for _, cond := range pod.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status != corev1.ConditionFalse
		}
	}
	return false
}

func (l *lifecycle) markNotReady(ctx context.Context, pod *corev1.Pod, now time.Time) {
	for i, cond := range pod.Status.Conditions {
		if cond.Type != corev1.PodReady {
			continue
		}
		if cond.Status == corev1.ConditionFalse {
			return
		}
		updated := pod.DeepCopy()
		updated.Status.Conditions[i].Status = corev1.ConditionFalse
		updated.Status.Conditions[i].LastTransitionTime = metav1.NewTime(now)
		if _, err := l.c.Kube.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			l.c.Logger.Warn("marking pod not ready", "pod", pod.Namespace+"/"+pod.Name, "error", err)
		}
		return
	}
}

// evict deletes the pod gracefully, as the taint manager does; its controller replaces it elsewhere.
//
// The eviction runs after the pass that decided it (queued behind other writes when many Nodes are lost at
// once): if the Node no longer has the taint by then (it came back), the pod stays, as Kubernetes' taint
// eviction controller cancels an eviction whose taint went away.
func (l *lifecycle) evict(ctx context.Context, pod *corev1.Pod, taint corev1.Taint) {
	if node, err := l.nodes.Get(pod.Spec.NodeName); err == nil && !slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return taint.MatchTaint(&t) }) {
		return
	}
	err := l.c.Kube.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		l.c.Logger.Warn("evicting pod", "pod", pod.Namespace+"/"+pod.Name, "error", err)
		return
	}
	l.c.Logger.Info("evicted pod from a lost node", "pod", pod.Namespace+"/"+pod.Name, "node", pod.Spec.NodeName, "taint", taint.Key)
	l.c.Recorder.Eventf(pod, corev1.EventTypeNormal, "TaintManagerEviction", "Marking for deletion Pod %s/%s", pod.Namespace, pod.Name)
}

func (l *lifecycle) forceDelete(ctx context.Context, pod *corev1.Pod, why string) {
	zero := int64(0)
	err := l.c.Kube.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &pod.UID}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		l.c.Logger.Warn("force-deleting pod", "pod", pod.Namespace+"/"+pod.Name, "error", err)
		return
	}
	l.c.Logger.Info("force-deleted pod", "pod", pod.Namespace+"/"+pod.Name, "why", why)
}

// orphanQuarantine is how long a pod bound to a missing Node waits before it is deleted, as Kubernetes'
// pod garbage collector waits: a Node may be recreated under the same name.
const orphanQuarantine = 40 * time.Second

// collectOrphans force-deletes pods bound to Nodes that no longer exist (`kubectl delete node`).
func (l *lifecycle) collectOrphans(ctx context.Context, nodes []*corev1.Node, now time.Time) {
	exists := make(map[string]bool, len(nodes))
	for _, n := range nodes {
		exists[n.Name] = true
	}
	seen := map[string]bool{}
	for _, key := range l.podIndex.ListIndexFuncValues(podsByNode) {
		if key == "" || exists[key] {
			continue
		}
		objs, _ := l.podIndex.ByIndex(podsByNode, key)
		for _, obj := range objs {
			pod := obj.(*corev1.Pod)
			id := pod.Namespace + "/" + pod.Name
			seen[id] = true
			since, ok := l.orphanSince[id]
			if !ok {
				l.orphanSince[id] = now
				continue
			}
			if now.Sub(since) >= orphanQuarantine {
				l.forceDelete(ctx, pod, fmt.Sprintf("its node %s was deleted", key))
			}
		}
	}
	for id := range l.orphanSince {
		if !seen[id] {
			delete(l.orphanSince, id)
		}
	}
}
