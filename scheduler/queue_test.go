package scheduler

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func queuePod(name string, priority int32, created int) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default",
			CreationTimestamp: metav1.NewTime(time.Unix(int64(created), 0))},
		Spec: corev1.PodSpec{Priority: &priority},
	}
}

func specPriority(p *corev1.Pod) int32 { return *p.Spec.Priority }

// fakeClock is a settable clock for the queue.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func newTestQueue() (*Queue, *fakeClock) {
	q := NewQueue(specPriority)
	clock := &fakeClock{t: time.Unix(1000, 0)}
	q.now = clock.now
	return q, clock
}

func popName(t *testing.T, q *Queue) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	qp := q.Pop(ctx)
	if qp == nil {
		return ""
	}
	return qp.pod.Name
}

func TestQueueOrdersByPriorityThenCreation(t *testing.T) {
	q, _ := newTestQueue()
	q.Add(queuePod("old-low", 0, 1))
	q.Add(queuePod("new-high", 100, 3))
	q.Add(queuePod("old-high", 100, 2))
	q.Add(queuePod("mid", 50, 0))
	for _, want := range []string{"old-high", "new-high", "mid", "old-low"} {
		if got := popName(t, q); got != want {
			t.Fatalf("popped %q, want %q", got, want)
		}
	}
}

func TestQueueUpdateChangesPriorityAndDeleteRemoves(t *testing.T) {
	q, _ := newTestQueue()
	q.Add(queuePod("a", 0, 1))
	q.Add(queuePod("b", 0, 2))
	q.Add(queuePod("b", 10, 2)) // an update of b raises its priority
	q.Add(queuePod("c", 0, 3))
	q.Delete(queuePod("a", 0, 1))
	for _, want := range []string{"b", "c"} {
		if got := popName(t, q); got != want {
			t.Fatalf("popped %q, want %q", got, want)
		}
	}
	if active, backoff, parked := q.Lengths(); active+backoff+parked != 0 {
		t.Fatalf("queue not empty: %d %d %d", active, backoff, parked)
	}
}

func TestQueueBackoffDoublesFromOneToTenSeconds(t *testing.T) {
	for attempts, want := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 4: 8 * time.Second, 5: 10 * time.Second, 9: 10 * time.Second} {
		qp := &queuedPod{attempts: attempts}
		start := time.Unix(0, 0)
		if got := qp.backoffUntil(start).Sub(start); got != want {
			t.Errorf("attempt %d: backoff %v, want %v", attempts, got, want)
		}
	}
}

func TestQueueBackoffHoldsAFailedPod(t *testing.T) {
	q, clock := newTestQueue()
	q.Add(queuePod("p", 0, 1))
	qp := q.Pop(context.Background())
	q.Backoff(qp) // first failure: 1 s
	q.flush()
	if active, backoff, _ := q.Lengths(); active != 0 || backoff != 1 {
		t.Fatalf("right after the failure: active %d backoff %d", active, backoff)
	}
	clock.t = clock.t.Add(time.Second)
	q.flush()
	if got := popName(t, q); got != "p" {
		t.Fatalf("after 1s popped %q", got)
	}
}

func TestQueueParkedPodWaitsForAnEventOrFiveMinutes(t *testing.T) {
	q, clock := newTestQueue()
	q.Add(queuePod("p", 0, 1))
	q.Unschedulable(q.Pop(context.Background()))
	clock.t = clock.t.Add(time.Minute)
	q.flush()
	if _, _, parked := q.Lengths(); parked != 1 {
		t.Fatalf("parked %d, want 1 after a minute without events", parked)
	}
	q.MoveAll() // a node appeared
	if got := popName(t, q); got != "p" {
		t.Fatalf("after the event popped %q", got)
	}
	q.Unschedulable(&queuedPod{pod: queuePod("p", 0, 1), key: "default/p", cycle: 99, attempts: 2})
	clock.t = clock.t.Add(maxUnschedulableStay)
	q.flush()
	if got := popName(t, q); got != "p" {
		t.Fatalf("after five minutes popped %q", got)
	}
}

func TestQueueEventDuringACycleIsNotLost(t *testing.T) {
	q, clock := newTestQueue()
	q.Add(queuePod("p", 0, 1))
	qp := q.Pop(context.Background())
	q.MoveAll() // a node appears while p is being decided on, after its snapshot
	q.Unschedulable(qp)
	if _, backoff, parked := q.Lengths(); backoff != 1 || parked != 0 {
		t.Fatalf("backoff %d parked %d: the pod must retry after its backoff, not wait for another event", backoff, parked)
	}
	clock.t = clock.t.Add(time.Second)
	q.flush()
	if got := popName(t, q); got != "p" {
		t.Fatalf("popped %q", got)
	}
}

func TestQueuePopReturnsNilWhenContextEnds(t *testing.T) {
	q, _ := newTestQueue()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan *queuedPod)
	go func() { done <- q.Pop(ctx) }()
	cancel()
	if qp := <-done; qp != nil {
		t.Fatalf("popped %v from an empty queue", qp.pod.Name)
	}
}

func TestQueueChangeDuringACycleIsNotParked(t *testing.T) {
	q, _ := newTestQueue()
	q.Add(queuePod("p", 0, 1))
	qp := q.Pop(context.Background())
	changed := queuePod("p", 0, 1)
	changed.Spec.NodeSelector = map[string]string{"disktype": "ssd"} // the user fixes the pod meanwhile
	q.Add(changed)
	q.Unschedulable(qp)
	if _, backoff, parked := q.Lengths(); backoff != 1 || parked != 0 {
		t.Fatalf("backoff %d parked %d: a pod changed during its cycle must be retried", backoff, parked)
	}
}

func TestQueueStatusUpdateDoesNotWakeAParkedPod(t *testing.T) {
	q, _ := newTestQueue()
	q.Add(queuePod("p", 0, 1))
	q.Unschedulable(q.Pop(context.Background()))
	withCondition := queuePod("p", 0, 1)
	withCondition.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse}}
	q.Add(withCondition) // the scheduler's own status patch coming back through the informer
	if active, backoff, parked := q.Lengths(); active != 0 || backoff != 0 || parked != 1 {
		t.Fatalf("active %d backoff %d parked %d: a status update must leave the pod parked", active, backoff, parked)
	}
}

func TestQueueNoDuplicateAfterAFailedBind(t *testing.T) {
	q, clock := newTestQueue()
	q.Add(queuePod("p", 0, 1))
	qp := q.Pop(context.Background())
	q.Done(qp)                  // assumed; the bind is in flight
	q.Add(queuePod("p", 10, 1)) // an update arrives during the bind
	q.Backoff(qp)               // then the bind fails
	clock.t = clock.t.Add(time.Minute)
	q.flush()
	if active, backoff, parked := q.Lengths(); active != 1 || backoff != 0 || parked != 0 {
		t.Fatalf("active %d backoff %d parked %d, want the pod queued exactly once", active, backoff, parked)
	}
}
