package fsm

import (
	"context"
	"sort"
	"strings"
	"sync"
)

// EventType says what happened to a key.
type EventType uint8

const (
	EventCreate EventType = iota + 1
	EventUpdate
	EventDelete
	// EventProgress carries no key: it tells a watcher that it has seen every change up to Revision.
	EventProgress
)

func (t EventType) String() string {
	return [...]string{"", "CREATE", "UPDATE", "DELETE", "PROGRESS"}[t]
}

// Event is one change in the watch history. KV is the new state (for a delete, only the key and the deleting
// revision); Prev is the state before, nil for a create. Events are shared: do not modify them.
type Event struct {
	Type     EventType
	KV       *KeyValue
	Prev     *KeyValue
	Revision int64
}

// history is a bounded ring of events, trimmed by count and by the age carried in the commands. Every event
// after revision `compacted` is in the ring.
type history struct {
	buf       []Event
	times     []int64 // proposer time of each event, parallel to buf
	maxAge    int64
	head      uint64 // sequence number of the next event
	size      int    // events held
	compacted int64
}

func newHistory(capacity int, maxAge int64, startRevision int64) *history {
	return &history{buf: make([]Event, capacity), times: make([]int64, capacity), maxAge: maxAge, compacted: startRevision}
}

func (h *history) oldest() uint64 { return h.head - uint64(h.size) }

func (h *history) at(seq uint64) *Event { return &h.buf[seq%uint64(len(h.buf))] }

func (h *history) add(ev Event, now int64) {
	if h.size == len(h.buf) {
		h.evictOldest()
	}
	i := h.head % uint64(len(h.buf))
	h.buf[i], h.times[i] = ev, now
	h.head++
	h.size++
}

func (h *history) evictOldest() {
	ev := h.at(h.oldest())
	h.compacted = ev.Revision
	*ev = Event{} // let the values be collected
	h.size--
}

// compactTo drops every event at or below rev; watches must start above it.
func (h *history) compactTo(rev int64) {
	for h.size > 0 && h.at(h.oldest()).Revision <= rev {
		h.evictOldest()
	}
	if rev > h.compacted {
		h.compacted = rev
	}
}

// trim drops events older than maxAge relative to now, the proposer time of the entry just applied.
func (h *history) trim(now int64) {
	for h.size > 0 && h.times[h.oldest()%uint64(len(h.buf))] < now-h.maxAge {
		h.evictOldest()
	}
}

// firstAfter returns the sequence number of the first event with a revision above rev.
func (h *history) firstAfter(rev int64) uint64 {
	start := h.oldest()
	n := sort.Search(h.size, func(i int) bool { return h.at(start+uint64(i)).Revision > rev })
	return start + uint64(n)
}

// maxBatch bounds the events one Next call returns.
const maxBatch = 1024

// Watcher streams the events under a prefix. Create one with Store.Watch and close it when done.
type Watcher struct {
	s        *Store
	prefix   string
	next     uint64 // sequence number of the next event to look at
	epoch    uint64
	progress chan struct{} // a pending progress request
	closed   chan struct{}
	close    sync.Once
}

// Watch subscribes to the changes under prefix after revision fromRev. Replay of the history and the live
// stream are one sequence, read from the same ring: no event falls between them and none comes twice. A
// fromRev older than the retained history fails with ErrCompacted.
func (s *Store) Watch(prefix string, fromRev int64) (*Watcher, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if fromRev < s.history.compacted {
		return nil, ErrCompacted
	}
	s.watchers.Add(1)
	return &Watcher{
		s: s, prefix: prefix, next: s.history.firstAfter(fromRev), epoch: s.epoch,
		progress: make(chan struct{}, 1), closed: make(chan struct{}),
	}, nil
}

// RequestProgress asks for an EventProgress once the watcher has caught up with every change applied so far.
// The revision is global, so a watcher on a quiet prefix learns how far the store has moved.
func (w *Watcher) RequestProgress() {
	select {
	case w.progress <- struct{}{}:
	default:
	}
}

// Next blocks until there are events for the watcher, then returns them in revision order. It returns
// ErrFallenBehind when the ring overwrote events the watcher had not read, ErrCompacted when a restore
// replaced the store, and ctx.Err() when ctx ends.
func (w *Watcher) Next(ctx context.Context) ([]Event, error) {
	for {
		events, wake, err := w.poll()
		if err != nil || len(events) > 0 {
			return events, err
		}
		select {
		case <-wake:
		case <-w.progress:
			// Re-arm so the next poll, which happens with the lock held, sees it.
			if ev, ok := w.progressEvent(); ok {
				return []Event{ev}, nil
			}
			w.RequestProgress()
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-w.closed:
			return nil, context.Canceled
		}
	}
}

// progressEvent returns the current revision if the watcher has seen every event.
func (w *Watcher) progressEvent() (Event, bool) {
	s := w.s
	s.mu.RLock()
	defer s.mu.RUnlock()
	if w.next != s.history.head {
		return Event{}, false
	}
	return Event{Type: EventProgress, Revision: s.revision}, true
}

func (w *Watcher) poll() ([]Event, <-chan struct{}, error) {
	s := w.s
	s.mu.RLock()
	defer s.mu.RUnlock()
	if w.epoch != s.epoch {
		return nil, nil, ErrCompacted
	}
	h := s.history
	if w.next < h.oldest() {
		return nil, nil, ErrFallenBehind
	}
	var out []Event
	for w.next < h.head && len(out) < maxBatch {
		ev := h.at(w.next)
		if strings.HasPrefix(ev.KV.Key, w.prefix) {
			out = append(out, *ev)
		}
		w.next++
	}
	return out, s.notify, nil
}

// Close ends the subscription. It is safe to call more than once.
func (w *Watcher) Close() {
	w.close.Do(func() {
		close(w.closed)
		w.s.watchers.Add(-1)
	})
}
