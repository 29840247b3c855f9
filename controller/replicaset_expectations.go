package controller

import (
	"sync"
	"time"
)

// expectationsTimeout bounds how long a ReplicaSet waits for the informer to report its creates and
// deletes. A watch event can be lost for good (a relist that skips a pod created and deleted in between);
// waiting for ever would stop the ReplicaSet from ever acting again.
const expectationsTimeout = 5 * time.Minute

// expectations are Kubernetes' ControllerExpectations: what a ReplicaSet's last sync did that the informer
// has not reported yet. The informer's cache lags the API; a sync that acted on it before the pods it
// created appear would create them again. Creates are counted; deletes are tracked by pod key (as
// Kubernetes' UIDTrackingControllerExpectations do), because a pod's delete can be reported more than
// once (on deletionTimestamp, then on removal) and must be counted once.
type expectations struct {
	mu    sync.Mutex
	byKey map[string]*expectation // by ReplicaSet key
}

type expectation struct {
	creates int             // creates issued and not yet seen; may go below zero
	deletes map[string]bool // keys of the pods whose delete has not been seen
	setAt   time.Time
}

func newExpectations() *expectations {
	return &expectations{byKey: map[string]*expectation{}}
}

// satisfied reports whether the ReplicaSet may act: nothing is expected of it, everything expected has
// been seen, or the wait has run out.
func (e *expectations) satisfied(key string, now time.Time) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	x, ok := e.byKey[key]
	if !ok {
		return true
	}
	return (x.creates <= 0 && len(x.deletes) == 0) || now.Sub(x.setAt) > expectationsTimeout
}

// expiresIn is how long until the ReplicaSet's wait runs out; 0 when nothing is awaited. No event may come to
// wake the ReplicaSet when it does (the lost event is the reason it waits), so the sync asks to look again.
func (e *expectations) expiresIn(key string, now time.Time) time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	x, ok := e.byKey[key]
	if !ok || (x.creates <= 0 && len(x.deletes) == 0) {
		return 0
	}
	return max(x.setAt.Add(expectationsTimeout).Sub(now), time.Second)
}

// expectCreations replaces what is expected of the ReplicaSet with n creates.
func (e *expectations) expectCreations(key string, n int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.byKey[key] = &expectation{creates: n, setAt: time.Now()}
}

// expectDeletions replaces what is expected of the ReplicaSet with the deletes of these pods.
func (e *expectations) expectDeletions(key string, podKeys []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	deletes := make(map[string]bool, len(podKeys))
	for _, k := range podKeys {
		deletes[k] = true
	}
	e.byKey[key] = &expectation{deletes: deletes, setAt: time.Now()}
}

// creationObserved counts one expected create as seen (or as never going to be).
func (e *expectations) creationObserved(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if x, ok := e.byKey[key]; ok {
		x.creates--
	}
}

// deletionObserved counts the pod's expected delete as seen (or as never going to be); a pod whose delete
// was not expected, or was already counted, changes nothing.
func (e *expectations) deletionObserved(key, podKey string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if x, ok := e.byKey[key]; ok {
		delete(x.deletes, podKey)
	}
}

// forget drops what was expected of a ReplicaSet that is gone.
func (e *expectations) forget(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.byKey, key)
}
