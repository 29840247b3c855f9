package fsm

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/btree"
)

// KeyValue is one key's state. Values read from the store are shared and immutable: copy before changing.
type KeyValue struct {
	Key            string
	Value          []byte
	CreateRevision int64
	ModRevision    int64
	ExpiresAt      int64 // Unix nanoseconds; 0 means the key never expires
}

// Options bound the watch history.
type Options struct {
	// HistoryEvents is the most events the watch history keeps. Default 100000.
	HistoryEvents int
	// HistoryAge is how long an event stays in the history, measured by the proposers' clocks carried in the
	// commands. Default 5 minutes, as etcd's compaction window.
	HistoryAge time.Duration
}

func (o *Options) withDefaults() Options {
	out := *o
	if out.HistoryEvents <= 0 {
		out.HistoryEvents = 100000
	}
	if out.HistoryAge <= 0 {
		out.HistoryAge = 5 * time.Minute
	}
	return out
}

// ttlItem orders TTL keys by expiry, then key.
type ttlItem struct {
	expiresAt int64
	key       string
}

func ttlLess(a, b ttlItem) bool {
	if a.expiresAt != b.expiresAt {
		return a.expiresAt < b.expiresAt
	}
	return a.key < b.key
}

func kvLess(a, b *KeyValue) bool { return a.Key < b.Key }

// Store is the revisioned key-value store. Apply and ApplyBatch are called by one goroutine (Raft's FSM
// loop), in log order; reads and watches may come from any goroutine.
type Store struct {
	opts Options

	mu       sync.RWMutex
	tree     *btree.BTreeG[*KeyValue]
	ttl      *btree.BTreeG[ttlItem]
	revision int64  // revision of the last change
	applied  uint64 // last applied Raft index, including no-ops
	history  *history
	epoch    uint64        // bumped by Restore; watchers from an older epoch are ended with ErrCompacted
	notify   chan struct{} // closed and replaced after every applied batch

	watchers atomic.Int64
	restores atomic.Uint64
}

// New returns an empty store at revision 0.
func New(opts Options) *Store {
	o := opts.withDefaults()
	return &Store{
		opts:    o,
		tree:    btree.NewG(32, kvLess),
		ttl:     btree.NewG(32, ttlLess),
		history: newHistory(o.HistoryEvents, o.HistoryAge.Nanoseconds(), 0),
		notify:  make(chan struct{}),
	}
}

// Entry is one Raft log entry for ApplyBatch. An entry with no Data stands for a Raft entry that carries no
// command; it only advances the applied index.
type Entry struct {
	Index uint64
	Data  []byte
}

// Apply applies one log entry at the given Raft index and returns the command's result.
func (s *Store) Apply(index uint64, data []byte) Result {
	return s.ApplyBatch([]Entry{{Index: index, Data: data}})[0]
}

// ApplyBatch applies consecutive log entries under one lock and wakes watchers once.
func (s *Store) ApplyBatch(entries []Entry) []Result {
	results := make([]Result, len(entries))
	s.mu.Lock()
	for i, e := range entries {
		results[i] = s.applyLocked(e.Index, e.Data)
	}
	wake := s.notify
	s.notify = make(chan struct{})
	s.mu.Unlock()
	close(wake)
	return results
}

func (s *Store) applyLocked(index uint64, data []byte) Result {
	if index <= s.applied {
		// Raft never reapplies an index; refusing protects the revision's monotonicity if it ever did.
		panic(fmt.Sprintf("fsm: entry %d applied after %d", index, s.applied))
	}
	s.applied = index
	if len(data) == 0 {
		// A Raft entry without a command (a configuration change): it moves the applied index only, so that
		// reads waiting for that index do not wait for the next write.
		return Result{Revision: s.revision}
	}
	if CommandType(data[0])&IgnoreUnknownFlag != 0 && commandTable[data[0]] == nil {
		return Result{Revision: s.revision, Code: CodeInvalid}
	}
	cmd, err := DecodeCommand(data)
	if err != nil {
		// Every replica sees the same bytes; continuing would let this one diverge if its decoder differs.
		panic(fmt.Sprintf("fsm: entry %d: %v", index, err))
	}
	t := &applyTxn{s: s, rev: int64(index), time: cmd.Time}
	res := commandTable[cmd.Type].apply(t, cmd)
	if t.changed {
		s.revision = t.rev
	}
	if cmd.Type == CmdNoop || cmd.Type == CmdCompact {
		// A no-op moves the revision too, so that after a restore or a new term the store's revision is the
		// Raft index and stays above every revision a client has seen. A compaction moves it as etcd's
		// compactor (which writes its own key) does.
		s.revision = t.rev
	}
	s.history.trim(cmd.Time)
	res.Revision = s.revision
	return res
}

// applyTxn is the mutation context of one log entry: every change it makes carries the entry's revision and
// is recorded in the history.
type applyTxn struct {
	s       *Store
	rev     int64
	time    int64
	changed bool
}

func (t *applyTxn) get(key string) *KeyValue {
	kv, _ := t.s.tree.Get(&KeyValue{Key: key})
	return kv
}

func (t *applyTxn) put(key string, value []byte, expiresAt int64) (prev, cur *KeyValue) {
	prev = t.get(key)
	cur = &KeyValue{Key: key, Value: value, CreateRevision: t.rev, ModRevision: t.rev, ExpiresAt: expiresAt}
	evType := EventCreate
	if prev != nil {
		cur.CreateRevision = prev.CreateRevision
		evType = EventUpdate
		t.untrackTTL(prev)
	}
	t.s.tree.ReplaceOrInsert(cur)
	if expiresAt != 0 {
		t.s.ttl.ReplaceOrInsert(ttlItem{expiresAt: expiresAt, key: key})
	}
	t.record(Event{Type: evType, KV: cur, Prev: prev, Revision: t.rev})
	return prev, cur
}

func (t *applyTxn) delete(key string) *KeyValue {
	prev, ok := t.s.tree.Delete(&KeyValue{Key: key})
	if !ok {
		return nil
	}
	t.untrackTTL(prev)
	t.record(Event{Type: EventDelete, KV: &KeyValue{Key: key, ModRevision: t.rev}, Prev: prev, Revision: t.rev})
	return prev
}

func (t *applyTxn) untrackTTL(kv *KeyValue) {
	if kv.ExpiresAt != 0 {
		t.s.ttl.Delete(ttlItem{expiresAt: kv.ExpiresAt, key: kv.Key})
	}
}

func (t *applyTxn) record(ev Event) {
	t.changed = true
	t.s.history.add(ev, t.time)
}

func applyNoop(t *applyTxn, c *Command) Result { return Result{} }

func applyCreate(t *applyTxn, c *Command) Result {
	if cur := t.get(c.Key); cur != nil {
		return Result{Code: CodeAlreadyExists, KV: cur}
	}
	_, kv := t.put(c.Key, c.Value, c.ExpiresAt)
	return Result{KV: kv}
}

func applyUpdate(t *applyTxn, c *Command) Result {
	cur := t.get(c.Key)
	if cur == nil {
		return Result{Code: CodeNotFound}
	}
	if c.ExpectedModRevision != 0 && cur.ModRevision != c.ExpectedModRevision {
		return Result{Code: CodeConflict, KV: cur}
	}
	_, kv := t.put(c.Key, c.Value, c.ExpiresAt)
	return Result{KV: kv}
}

func applyDelete(t *applyTxn, c *Command) Result {
	cur := t.get(c.Key)
	if cur == nil {
		return Result{Code: CodeNotFound}
	}
	if c.ExpectedModRevision != 0 && cur.ModRevision != c.ExpectedModRevision {
		return Result{Code: CodeConflict, KV: cur}
	}
	return Result{KV: t.delete(c.Key)}
}

func applyTxnCommand(t *applyTxn, c *Command) Result {
	if c.Txn == nil {
		return Result{Code: CodeInvalid}
	}
	ok := true
	for _, cmp := range c.Txn.Compares {
		if !compareHolds(t.get(cmp.Key), cmp) {
			ok = false
			break
		}
	}
	ops := c.Txn.Failure
	if ok {
		ops = c.Txn.Success
	}
	res := Result{Succeeded: ok, Responses: make([]*KeyValue, len(ops))}
	for i, op := range ops {
		switch op.Type {
		case OpGet:
			res.Responses[i] = t.get(op.Key)
		case OpPut:
			res.Responses[i], _ = t.put(op.Key, op.Value, op.ExpiresAt)
		case OpDelete:
			res.Responses[i] = t.delete(op.Key)
		}
	}
	return res
}

func applyCompact(t *applyTxn, c *Command) Result {
	t.s.history.compactTo(min(c.CompactRevision, t.s.revision))
	return Result{}
}

func compareHolds(kv *KeyValue, c Compare) bool {
	var cmp int
	switch c.Target {
	case CompareModRevision, CompareCreateRevision:
		var have int64
		if kv != nil {
			have = kv.ModRevision
			if c.Target == CompareCreateRevision {
				have = kv.CreateRevision
			}
		}
		cmp = compareInt(have, c.Revision)
	case CompareValue:
		var have []byte
		if kv != nil {
			have = kv.Value
		}
		cmp = strings.Compare(string(have), string(c.Value))
	default:
		return false
	}
	switch c.Result {
	case CompareEqual:
		return cmp == 0
	case CompareNotEqual:
		return cmp != 0
	case CompareLess:
		return cmp < 0
	case CompareGreater:
		return cmp > 0
	}
	return false
}

func compareInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Revision returns the store's current revision.
func (s *Store) Revision() int64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.revision
}

// AppliedIndex returns the last Raft index applied, no-ops included. Linearizable reads wait on it.
func (s *Store) AppliedIndex() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.applied
}

// WaitApplied blocks until the store has applied index, or done is closed. It returns false on done.
func (s *Store) WaitApplied(index uint64, done <-chan struct{}) bool {
	for {
		s.mu.RLock()
		applied, wake := s.applied, s.notify
		s.mu.RUnlock()
		if applied >= index {
			return true
		}
		select {
		case <-wake:
		case <-done:
			return false
		}
	}
}

// Get returns a key's state and the store's revision. A missing key returns ErrNotFound.
func (s *Store) Get(key string) (*KeyValue, int64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	kv, ok := s.tree.Get(&KeyValue{Key: key})
	if !ok {
		return nil, s.revision, ErrNotFound
	}
	return kv, s.revision, nil
}

// RangeResult is one page of a Range.
type RangeResult struct {
	KVs      []*KeyValue
	More     bool  // more keys under the prefix follow the last one returned
	Revision int64 // the store's revision when the page was read
}

// Range returns keys under prefix in key order, starting at startKey (inclusive) when it is not empty, at most
// limit of them (0 means no limit).
func (s *Store) Range(prefix, startKey string, limit int) RangeResult {
	s.mu.RLock()
	defer s.mu.RUnlock()
	from := prefix
	if startKey > from {
		from = startKey
	}
	res := RangeResult{Revision: s.revision}
	s.tree.AscendGreaterOrEqual(&KeyValue{Key: from}, func(kv *KeyValue) bool {
		if !strings.HasPrefix(kv.Key, prefix) {
			return false
		}
		if limit > 0 && len(res.KVs) == limit {
			res.More = true
			return false
		}
		res.KVs = append(res.KVs, kv)
		return true
	})
	return res
}

// Count returns how many keys live under prefix, and the store's revision.
func (s *Store) Count(prefix string) (int64, int64) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var n int64
	s.tree.AscendGreaterOrEqual(&KeyValue{Key: prefix}, func(kv *KeyValue) bool {
		if !strings.HasPrefix(kv.Key, prefix) {
			return false
		}
		n++
		return true
	})
	return n, s.revision
}

// Len returns the number of live keys.
func (s *Store) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.tree.Len()
}

// Expired returns up to max keys whose expiry is at or before now, with their mod revisions, so that the
// leader can propose deletes that lose to a concurrent refresh. now comes from the caller: the store reads no
// clock.
func (s *Store) Expired(now int64, max int) []*KeyValue {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []*KeyValue
	s.ttl.Ascend(func(it ttlItem) bool {
		if it.expiresAt > now || len(out) == max {
			return false
		}
		if kv, ok := s.tree.Get(&KeyValue{Key: it.key}); ok {
			out = append(out, kv)
		}
		return true
	})
	return out
}

// CompactedRevision returns the oldest revision a watch may start from.
func (s *Store) CompactedRevision() int64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.history.compacted
}

// Restores returns how many snapshots this store restored, for tests and metrics.
func (s *Store) Restores() uint64 { return s.restores.Load() }

// Watchers returns the number of open watchers, for metrics.
func (s *Store) Watchers() int64 { return s.watchers.Load() }
