package scheduler

import (
	"container/heap"
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
)

// Backoff and parking bounds, as Kubernetes' defaults.
const (
	initialBackoff       = 1 * time.Second
	maxBackoff           = 10 * time.Second
	maxUnschedulableStay = 5 * time.Minute
)

// queuedPod is a pod waiting for a decision.
type queuedPod struct {
	pod      *corev1.Pod
	key      string
	priority int32
	attempts int
	// cycle is the scheduling cycle that popped the pod; parkedAt is when it became unschedulable.
	cycle    int64
	parkedAt time.Time
	index    int
	// updated is set when the pod's spec or labels changed while it was being scheduled: the decision
	// under way saw the old version, so the pod must not be parked on it.
	updated bool
}

func podKey(pod *corev1.Pod) string { return pod.Namespace + "/" + pod.Name }

// backoffUntil is when a pod that failed attempts times may be tried again: 1 s doubling up to 10 s.
func (q *queuedPod) backoffUntil(last time.Time) time.Time {
	d := initialBackoff
	for i := 1; i < q.attempts && d < maxBackoff; i++ {
		d *= 2
	}
	return last.Add(min(d, maxBackoff))
}

// Queue holds the pods to schedule in three parts, as Kubernetes' scheduling queue does:
//   - active: ready now, ordered by priority, then by creation time;
//   - backoff: failed recently, waiting out a per-pod exponential backoff;
//   - unschedulable: fitted nowhere; parked until a cluster event that could help, or five minutes.
type Queue struct {
	mu            sync.Mutex
	cond          *sync.Cond
	active        podHeap
	activeKeys    map[string]*queuedPod
	backoff       map[string]*queuedPod
	backoffAt     map[string]time.Time
	unschedulable map[string]*queuedPod
	inFlight      map[string]*queuedPod
	// cycle counts pops; moveCycle is the cycle of the last cluster event. A pod found unschedulable in a
	// cycle at or before moveCycle may have missed the event that helps it, so it goes to backoff instead of
	// being parked.
	cycle, moveCycle int64
	priority         func(*corev1.Pod) int32
	now              func() time.Time
}

// NewQueue returns an empty queue; priority gives a pod's priority.
func NewQueue(priority func(*corev1.Pod) int32) *Queue {
	q := &Queue{
		activeKeys: map[string]*queuedPod{},
		backoff:    map[string]*queuedPod{}, backoffAt: map[string]time.Time{},
		unschedulable: map[string]*queuedPod{}, inFlight: map[string]*queuedPod{},
		priority: priority, now: time.Now,
	}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// Add adds a new pending pod, or updates it wherever it waits.
func (q *Queue) Add(pod *corev1.Pod) {
	q.mu.Lock()
	defer q.mu.Unlock()
	key := podKey(pod)
	if qp, ok := q.inFlight[key]; ok {
		// The decision under way sees the old version; the next one sees this. A recreated pod (its
		// delete marked qp.pod nil) counts as changed.
		qp.updated = qp.updated || qp.pod == nil || schedulingChanged(qp.pod, pod)
		qp.pod = pod
		return
	}
	if qp, ok := q.activeKeys[key]; ok {
		qp.pod, qp.priority = pod, q.priority(pod)
		heap.Fix(&q.active, qp.index)
		return
	}
	if qp, ok := q.backoff[key]; ok {
		qp.pod = pod
		return
	}
	if qp, ok := q.unschedulable[key]; ok {
		if !schedulingChanged(qp.pod, pod) {
			qp.pod = pod // a status update (the scheduler's own condition patch, say) helps nothing
			return
		}
		// The pod itself changed (for example its node selector); that may make it schedulable.
		delete(q.unschedulable, key)
		qp.pod = pod
		q.requeueLocked(key, qp)
		return
	}
	q.pushLocked(&queuedPod{pod: pod, key: key, priority: q.priority(pod)})
}

func (q *Queue) pushLocked(qp *queuedPod) {
	heap.Push(&q.active, qp)
	q.activeKeys[qp.key] = qp
	q.cond.Signal()
}

// Delete removes a pod that was deleted or bound by someone else.
func (q *Queue) Delete(pod *corev1.Pod) {
	q.mu.Lock()
	defer q.mu.Unlock()
	key := podKey(pod)
	if qp, ok := q.activeKeys[key]; ok {
		heap.Remove(&q.active, qp.index)
		delete(q.activeKeys, key)
	}
	delete(q.backoff, key)
	delete(q.backoffAt, key)
	delete(q.unschedulable, key)
	if qp, ok := q.inFlight[key]; ok {
		qp.pod = nil // Done drops it
	}
}

// Pop waits for the next pod to schedule; it returns nil once ctx ends.
func (q *Queue) Pop(ctx context.Context) *queuedPod {
	stop := context.AfterFunc(ctx, func() {
		q.mu.Lock() // taken so that the wake-up cannot fall between a waiter's check and its Wait
		q.mu.Unlock()
		q.cond.Broadcast()
	})
	defer stop()
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.active) == 0 && ctx.Err() == nil {
		q.cond.Wait()
	}
	if ctx.Err() != nil {
		return nil
	}
	qp := heap.Pop(&q.active).(*queuedPod)
	delete(q.activeKeys, qp.key)
	q.cycle++
	qp.cycle = q.cycle
	qp.attempts++
	qp.updated = false
	q.inFlight[qp.key] = qp
	return qp
}

// Done ends a pod's cycle after a successful assumption: it leaves the queue.
func (q *Queue) Done(qp *queuedPod) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.inFlight, qp.key)
}

// Unschedulable parks a pod that fitted nowhere, or backs it off if a cluster event arrived meanwhile or the
// pod itself changed.
func (q *Queue) Unschedulable(qp *queuedPod) {
	q.mu.Lock()
	defer q.mu.Unlock()
	key := qp.key
	delete(q.inFlight, key)
	if qp.pod == nil || q.queuedLocked(key) { // deleted meanwhile, or re-added as a new entry
		return
	}
	if q.moveCycle >= qp.cycle || qp.updated {
		q.backoff[key], q.backoffAt[key] = qp, q.now()
		return
	}
	qp.parkedAt = q.now()
	q.unschedulable[key] = qp
}

// Backoff requeues a pod after an error (a failed bind), once its backoff has passed.
func (q *Queue) Backoff(qp *queuedPod) {
	q.mu.Lock()
	defer q.mu.Unlock()
	key := qp.key
	delete(q.inFlight, key)
	if qp.pod == nil || q.queuedLocked(key) { // deleted meanwhile, or re-added as a new entry
		return
	}
	q.backoff[key], q.backoffAt[key] = qp, q.now()
}

// queuedLocked reports whether a key waits in any part of the queue.
func (q *Queue) queuedLocked(key string) bool {
	_, active := q.activeKeys[key]
	_, backoff := q.backoff[key]
	_, parked := q.unschedulable[key]
	return active || backoff || parked
}

// Pod returns the latest version of a popped pod, or nil once it was deleted.
func (q *Queue) Pod(qp *queuedPod) *corev1.Pod {
	q.mu.Lock()
	defer q.mu.Unlock()
	return qp.pod
}

// schedulingChanged reports whether an update can change a scheduling decision: the spec, labels or
// annotations, not the status.
func schedulingChanged(old, new *corev1.Pod) bool {
	return !apiequality.Semantic.DeepEqual(old.Spec, new.Spec) || !apiequality.Semantic.DeepEqual(old.Labels, new.Labels) ||
		!apiequality.Semantic.DeepEqual(old.Annotations, new.Annotations)
}

// MoveAll requeues every parked pod: a cluster event (a node added or changed, a pod deleted) may have
// made room. Pods still within their backoff wait it out first.
func (q *Queue) MoveAll() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.moveCycle = q.cycle
	for key, qp := range q.unschedulable {
		delete(q.unschedulable, key)
		q.requeueLocked(key, qp)
	}
}

func (q *Queue) requeueLocked(key string, qp *queuedPod) {
	if !qp.parkedAt.IsZero() && q.now().Before(qp.backoffUntil(qp.parkedAt)) {
		q.backoff[key], q.backoffAt[key] = qp, qp.parkedAt
		return
	}
	q.pushLocked(qp)
}

// flush moves pods whose backoff has passed to active, and pods parked for five minutes too.
func (q *Queue) flush() {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.now()
	for key, qp := range q.backoff {
		if !now.Before(qp.backoffUntil(q.backoffAt[key])) {
			delete(q.backoff, key)
			delete(q.backoffAt, key)
			q.pushLocked(qp)
		}
	}
	for key, qp := range q.unschedulable {
		if now.Sub(qp.parkedAt) >= maxUnschedulableStay {
			delete(q.unschedulable, key)
			q.pushLocked(qp)
		}
	}
}

// Run flushes the backoff and parked pods every second until ctx ends.
func (q *Queue) Run(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			q.flush()
		}
	}
}

// Lengths returns the sizes of the active, backoff and unschedulable parts, for metrics and tests.
func (q *Queue) Lengths() (active, backoff, unschedulable int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.active), len(q.backoff), len(q.unschedulable)
}

// podHeap orders pods by priority, highest first, then by creation time, oldest first.
type podHeap []*queuedPod

func (h podHeap) Len() int { return len(h) }
func (h podHeap) Less(i, j int) bool {
	if h[i].priority != h[j].priority {
		return h[i].priority > h[j].priority
	}
	ti, tj := h[i].pod.CreationTimestamp, h[j].pod.CreationTimestamp
	if !ti.Equal(&tj) {
		return ti.Before(&tj)
	}
	return h[i].key < h[j].key
}
func (h podHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i]; h[i].index = i; h[j].index = j }
func (h *podHeap) Push(x any)   { qp := x.(*queuedPod); qp.index = len(*h); *h = append(*h, qp) }
func (h *podHeap) Pop() any {
	old := *h
	qp := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return qp
}
