package nodeagent

import (
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

const (
	crashLoopInitialBackoff = 10 * time.Second
	crashLoopMaxBackoff     = 300 * time.Second
	crashLoopBackoffReset   = 10 * time.Minute
	imagePullInitialBackoff = 10 * time.Second
	imagePullMaxBackoff     = 300 * time.Second
)

// backoffKey is the key of a pod's container in a restartBackoff.
func backoffKey(uid types.UID, container string) string {
	return string(uid) + "/" + container
}

// restartBackoff is the crash-loop restart backoff of the kubelet: the delay before restart n grows from
// initial, doubling each time, up to max; it starts over at initial when the container had run for at least
// resetAfter before it exited (resetAfter 0: never). The image pull backoff uses the same type. Keys are
// usually backoffKey(pod UID, container name). Safe for concurrent use.
type restartBackoff struct {
	initial, max, resetAfter time.Duration
	now                      func() time.Time

	mu      sync.Mutex
	entries map[string]*backoffEntry
}

type backoffEntry struct {
	delay     time.Duration // the last delay handed out
	until     time.Time     // no restart before this
	started   time.Time     // the exit last recorded, to make next idempotent
	finished  time.Time
	hasFinish bool
}

// newRestartBackoff builds a backoff; now is the clock (nil: time.Now).
func newRestartBackoff(initial, max, resetAfter time.Duration, now func() time.Time) *restartBackoff {
	if now == nil {
		now = time.Now
	}
	if max < initial {
		max = initial
	}
	return &restartBackoff{initial: initial, max: max, resetAfter: resetAfter, now: now, entries: map[string]*backoffEntry{}}
}

// next records a container exit (when it started, when it finished) and returns when it may be restarted:
// finishedAt (now when zero) plus the next delay. Recording the same exit (same non-zero finishedAt and
// startedAt) again changes nothing and returns the same time, so a sync may call it for every exited
// container it sees. An image pull failure passes zero times (or the failure time as finishedAt).
func (b *restartBackoff) next(key string, startedAt, finishedAt time.Time) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entries[key]
	if e != nil && !finishedAt.IsZero() && e.hasFinish && e.finished.Equal(finishedAt) && e.started.Equal(startedAt) {
		return e.until
	}
	ranLong := b.resetAfter > 0 && !startedAt.IsZero() && !finishedAt.IsZero() && finishedAt.Sub(startedAt) >= b.resetAfter
	switch {
	case e == nil:
		e = &backoffEntry{delay: b.initial}
		b.entries[key] = e
	case ranLong:
		e.delay = b.initial
	default:
		e.delay = min(2*e.delay, b.max)
	}
	base := finishedAt
	if base.IsZero() {
		base = b.now()
	}
	e.until = base.Add(e.delay)
	e.started, e.finished, e.hasFinish = startedAt, finishedAt, !finishedAt.IsZero()
	return e.until
}

// inBackoff tells whether a restart now is still too early, and how long remains.
func (b *restartBackoff) inBackoff(key string) (bool, time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.entries[key]
	if e == nil {
		return false, 0
	}
	if left := e.until.Sub(b.now()); left > 0 {
		return true, left
	}
	return false, 0
}

// delay is the last delay handed out for key (0 when none), for messages such as
// "back-off 40s restarting failed container".
func (b *restartBackoff) delay(key string) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.entries[key]; e != nil {
		return e.delay
	}
	return 0
}

// forget drops key's history: its next exit waits initial again.
func (b *restartBackoff) forget(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.entries, key)
}

// forgetPod drops the history of all of a pod's keys (those made by backoffKey).
func (b *restartBackoff) forgetPod(uid types.UID) {
	prefix := string(uid) + "/"
	b.mu.Lock()
	defer b.mu.Unlock()
	for k := range b.entries {
		if strings.HasPrefix(k, prefix) {
			delete(b.entries, k)
		}
	}
}
