package raftnode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/skiff-dev/skiff/fsm"
)

// A leader that loses its leadership while a write is in flight (its lease lapsed: a partition, or a peer
// starved of CPU) does not know whether the write's entry will commit: hashicorp/raft fails the write's future
// with ErrLeadershipLost. Rather than hand the client that unknown outcome, the former leader learns it: it
// waits for a leader's commit index (the ReadIndex protocol), and then either its own store applied the entry
// at the write's index, and the bytes are the write's own (the command carries its proposer's clock, so two
// proposals' bytes differ), or the entry there is another, or the commit index stops short of it. In the last
// two cases the entry can never commit: the new leader committed a no-op of a later term at or before that
// index, and a log's terms never decrease along it. So the write is either answered with the store's own
// result or proposed again, once the cluster has a leader.

// outcome is what the local store applied at one index: the entry's bytes and the result.
type outcome struct {
	data []byte
	res  fsm.Result
}

// outcomeWaiters holds the indexes of writes whose outcome is being learned, and hands each the entry applied
// there. Apply calls deliver for every batch; it costs one atomic load while nobody waits.
type outcomeWaiters struct {
	n       atomic.Int64
	mu      sync.Mutex
	waiters map[uint64]chan outcome
	// through is the last index of the last batch handed out while somebody waited, and handed is closed (and
	// replaced) after each such batch. The store makes a batch's indexes visible as applied before the FSM
	// loop hands its outcomes out, so a waiter that sees its index applied must still wait for the hand-out.
	through uint64
	handed  chan struct{}
	// beforeDeliver, when set (tests), runs between a batch's apply and the hand-out of its outcomes.
	beforeDeliver atomic.Pointer[func()]
}

func (w *outcomeWaiters) add(index uint64) chan outcome {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.waiters == nil {
		w.waiters = make(map[uint64]chan outcome)
	}
	ch := make(chan outcome, 1)
	w.waiters[index] = ch
	w.n.Add(1)
	return ch
}

func (w *outcomeWaiters) remove(index uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, ok := w.waiters[index]; ok {
		delete(w.waiters, index)
		w.n.Add(-1)
	}
}

// deliver hands the waiters of these entries' indexes what was applied there. It runs in the FSM loop and
// never blocks.
func (w *outcomeWaiters) deliver(entries []fsm.Entry, results []fsm.Result) {
	if hook := w.beforeDeliver.Load(); hook != nil {
		(*hook)()
	}
	if w.n.Load() == 0 || len(entries) == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, e := range entries {
		if ch, ok := w.waiters[e.Index]; ok {
			ch <- outcome{data: e.Data, res: results[i]}
			delete(w.waiters, e.Index)
			w.n.Add(-1)
		}
	}
	w.through = max(w.through, entries[len(entries)-1].Index)
	if w.handed != nil {
		close(w.handed)
		w.handed = nil
	}
}

// waitHanded waits, while a waiter is registered at index and the store has passed it, until the batch that
// took the store past index has been handed out, or until stop says to give up (it is polled too, for what no
// batch hands out: a snapshot's restore). It reports whether the hand-out happened.
func (w *outcomeWaiters) waitHanded(ctx context.Context, index uint64, stop func() bool) bool {
	for {
		w.mu.Lock()
		if w.through >= index {
			w.mu.Unlock()
			return true
		}
		if w.handed == nil {
			w.handed = make(chan struct{})
		}
		handed := w.handed
		w.mu.Unlock()
		if stop() {
			return false
		}
		select {
		case <-handed:
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return false
		}
	}
}

// errNotCommitted marks a write that is known never to commit: proposing it again is safe.
var errNotCommitted = errors.New("raftnode: the write's entry was not committed")

// learnOutcome finds out whether the entry this peer proposed at index, with these bytes, committed after its
// leadership was lost. It returns the store's result if it did, errNotCommitted if it never will, and
// ErrUnknownOutcome (wrapping cause) if that cannot be learned before ctx ends.
func (n *Node) learnOutcome(ctx context.Context, index uint64, data []byte, cause error) (res fsm.Result, err error) {
	defer func() {
		outcome := "committed"
		switch {
		case errors.Is(err, errNotCommitted):
			outcome = "not_committed"
		case err != nil:
			outcome = "unknown"
		}
		n.metrics.lostWrites.WithLabelValues(outcome).Inc()
	}()
	unknown := func(why string) (fsm.Result, error) {
		return fsm.Result{}, fmt.Errorf("%w (%v; %s)", ErrUnknownOutcome, cause, why)
	}
	if index == 0 {
		return unknown("the entry's index is not known")
	}
	ch := n.outcomes.add(index)
	defer n.outcomes.remove(index)
	restores := n.store.Restores()
	if n.store.AppliedIndex() >= index {
		// Applied before this peer looked: only possible if a new leader committed it at once; the bytes
		// applied there are no longer at hand.
		return unknown("its index was applied before the outcome was looked for")
	}
	if err := n.LinearizableRead(ctx); err != nil {
		return unknown(fmt.Sprintf("no leader answered: %v", err))
	}
	// Once the store has passed index, the batch that took it there is handed out right after (it holds the
	// write's entry, if it committed). Deciding before that took a committed write for one never committed,
	// and it was proposed, and applied, again.
	restored := func() bool { return n.store.Restores() != restores }
	if n.store.AppliedIndex() >= index && !n.outcomes.waitHanded(ctx, index, restored) && !restored() {
		return unknown(fmt.Sprintf("its batch's outcomes were not handed out: %v", ctx.Err()))
	}
	select {
	case o := <-ch:
		if bytes.Equal(o.data, data) {
			n.logger.Debug("a write in flight when leadership was lost committed", "index", index)
			return o.res, nil
		}
		return fsm.Result{}, errNotCommitted
	default:
	}
	if n.store.AppliedIndex() >= index && n.store.Restores() != restores {
		// The store may have reached index by a snapshot's restore, which carries no entries.
		return unknown("a snapshot was installed over its index")
	}
	// Either the store passed index without a command there (hashicorp/raft gives the FSM no no-op entries:
	// a new leader's no-op took the index), or LinearizableRead waited for it to reach a leader's commit
	// index that is below index. Either way the write's entry is not in the committed log.
	return fsm.Result{}, errNotCommitted
}
