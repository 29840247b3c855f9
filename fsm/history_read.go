package fsm

import (
	"errors"
	"sort"
	"strings"
)

// ErrFutureRevision is returned for a read at a revision the store has not reached yet.
var ErrFutureRevision = errors.New("requested revision is newer than the store's")

// RangeAt is Range as the store was at revision rev. rev must lie within the retained watch history
// (ErrCompacted otherwise) and must not exceed the current revision (ErrFutureRevision). The page is built from
// the current tree, with every key changed after rev replaced by its state at rev, taken from the history.
// RangeResult.Revision is rev.
func (s *Store) RangeAt(prefix, startKey string, limit int, rev int64) (RangeResult, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if rev > s.revision {
		return RangeResult{}, ErrFutureRevision
	}
	if rev < s.history.compacted {
		return RangeResult{}, ErrCompacted
	}
	from := prefix
	if startKey > from {
		from = startKey
	}
	// The state at rev of each key changed since: the previous value of its first later event.
	atRev := map[string]*KeyValue{}
	h := s.history
	for seq := h.firstAfter(rev); seq < h.head; seq++ {
		ev := h.at(seq)
		key := ev.KV.Key
		if !strings.HasPrefix(key, prefix) || key < from {
			continue
		}
		if _, seen := atRev[key]; !seen {
			atRev[key] = ev.Prev
		}
	}
	changed := make([]string, 0, len(atRev))
	for k := range atRev {
		changed = append(changed, k)
	}
	sort.Strings(changed)

	res := RangeResult{Revision: rev}
	full := false
	emit := func(kv *KeyValue) bool {
		if kv == nil {
			return true
		}
		if limit > 0 && len(res.KVs) == limit {
			res.More, full = true, true
			return false
		}
		res.KVs = append(res.KVs, kv)
		return true
	}
	s.tree.AscendGreaterOrEqual(&KeyValue{Key: from}, func(kv *KeyValue) bool {
		if !strings.HasPrefix(kv.Key, prefix) {
			return false
		}
		for len(changed) > 0 && changed[0] < kv.Key {
			if !emit(atRev[changed[0]]) {
				return false
			}
			changed = changed[1:]
		}
		if len(changed) > 0 && changed[0] == kv.Key {
			changed = changed[1:]
			return emit(atRev[kv.Key])
		}
		return emit(kv)
	})
	for !full && len(changed) > 0 {
		if !emit(atRev[changed[0]]) {
			break
		}
		changed = changed[1:]
	}
	return res, nil
}
