package chaos

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// Builders of hand-made histories. Times are in milliseconds; every op succeeds unless a modifier says.

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

func hCreate(w int, key, value string, call, ret int, rv int64) Op {
	return Op{Worker: w, Kind: OpCreate, Key: key, Value: value, Call: ms(call), Return: ms(ret), Outcome: OutcomeOK, RV: rv, ReadValue: value}
}

func hUpdate(w int, key, value string, pre int64, call, ret int, rv int64) Op {
	return Op{Worker: w, Kind: OpUpdate, Key: key, Value: value, PreconditionRV: pre, Call: ms(call), Return: ms(ret), Outcome: OutcomeOK, RV: rv, ReadValue: value}
}

func hDelete(w int, key string, pre int64, call, ret int) Op {
	return Op{Worker: w, Kind: OpDelete, Key: key, PreconditionRV: pre, Call: ms(call), Return: ms(ret), Outcome: OutcomeOK}
}

func hGet(w int, key string, call, ret int, value string, rv int64) Op {
	return Op{Worker: w, Kind: OpGet, Key: key, Call: ms(call), Return: ms(ret), Outcome: OutcomeOK, Found: true, ReadValue: value, RV: rv}
}

func hList(w int, call, ret int, rv int64, items ...Item) Op {
	return Op{Worker: w, Kind: OpList, Call: ms(call), Return: ms(ret), Outcome: OutcomeOK, RV: rv, Items: items}
}

// failed makes op a definite failure with the code's usual reason.
func failed(op Op, code int) Op {
	op.Outcome, op.Code, op.RV, op.Found, op.ReadValue = OutcomeFailed, code, 0, false, ""
	switch {
	case code == 404:
		op.Reason = "NotFound"
	case code == 409 && op.Kind == OpCreate:
		op.Reason = "AlreadyExists"
	case code == 409:
		op.Reason = "Conflict"
	}
	return op
}

// unknown makes op one without an answer.
func unknown(op Op) Op {
	op.Outcome, op.Code, op.Reason, op.RV, op.Found, op.ReadValue, op.Err = OutcomeUnknown, 504, "Timeout", 0, false, "", "outcome unknown"
	return op
}

func history(ops ...Op) *History { return &History{Namespace: "chaos-test", Ops: ops} }

func TestChecksOnHandBuiltHistories(t *testing.T) {
	cases := []struct {
		name  string
		h     *History
		final map[string]FinalObject
		// Which checks must fail.
		badLin, badList, badLost bool
	}{
		{
			name: "linearizable",
			h: history(
				hCreate(0, "k0", "w0-1", 0, 10, 10),
				hGet(1, "k0", 11, 12, "w0-1", 10),
				failed(hCreate(2, "k0", "w2-1", 11, 13, 0), 409),
				hUpdate(1, "k0", "w1-1", 10, 13, 20, 12),
				failed(hUpdate(2, "k0", "w2-2", 9, 14, 15, 0), 409), // stale precondition
				hGet(0, "k0", 14, 16, "w0-1", 10),                   // concurrent with the update: before it
				hList(0, 21, 22, 13, Item{"k0", "w1-1", 12}),
				hCreate(1, "k1", "w1-2", 21, 23, 14),
				hList(2, 22, 30, 14, Item{"k0", "w1-1", 12}, Item{"k1", "w1-2", 14}),
				hDelete(0, "k0", 12, 31, 32),
				failed(hGet(1, "k0", 33, 34, "", 0), 404),
				failed(hDelete(2, "k0", 12, 33, 35), 404),
				failed(hUpdate(0, "k0", "w0-2", 12, 36, 37, 0), 404),
				hList(1, 36, 37, 16, Item{"k1", "w1-2", 14}),
				hCreate(2, "k0", "w2-3", 38, 39, 17),
			),
			final: map[string]FinalObject{"k0": {"w2-3", 17}, "k1": {"w1-2", 14}},
		},
		{
			name: "stale read",
			h: history(
				hCreate(0, "k0", "w0-1", 0, 1, 10),
				hUpdate(0, "k0", "w0-2", 10, 2, 3, 11),
				hGet(1, "k0", 4, 5, "w0-1", 10),
			),
			final:  map[string]FinalObject{"k0": {"w0-2", 11}},
			badLin: true,
		},
		{
			name: "read of a deleted object",
			h: history(
				hCreate(0, "k0", "w0-1", 0, 1, 10),
				hDelete(0, "k0", 10, 2, 3),
				hGet(1, "k0", 4, 5, "w0-1", 10),
			),
			final:  map[string]FinalObject{},
			badLin: true,
		},
		{
			name: "update accepted with a stale precondition",
			h: history(
				hCreate(0, "k0", "w0-1", 0, 1, 10),
				hUpdate(0, "k0", "w0-2", 10, 2, 3, 11),
				hUpdate(1, "k0", "w1-1", 10, 4, 5, 12),
			),
			final:   map[string]FinalObject{"k0": {"w1-1", 12}},
			badLin:  true,
			badLost: true, // w0-2 was never replaced, yet it is gone
		},
		{
			name: "lost write",
			h: history(
				hCreate(0, "k0", "w0-1", 0, 1, 10),
				hUpdate(0, "k0", "w0-2", 10, 2, 3, 11),
			),
			final:   map[string]FinalObject{"k0": {"w0-1", 10}},
			badLost: true,
		},
		{
			name: "lost create",
			h: history(
				hCreate(0, "k0", "w0-1", 0, 1, 10),
			),
			final:   map[string]FinalObject{},
			badLost: true,
		},
		{
			name: "resurrected object",
			h: history(
				hCreate(0, "k0", "w0-1", 0, 1, 10),
				hDelete(0, "k0", 10, 2, 3),
			),
			final:   map[string]FinalObject{"k0": {"w0-1", 10}},
			badLost: true,
		},
		{
			name: "phantom value",
			h: history(
				hCreate(0, "k0", "w0-1", 0, 1, 10),
				hDelete(0, "k0", 10, 2, 3),
			),
			final:   map[string]FinalObject{"k0": {"w9-9", 20}},
			badLost: true,
		},
		{
			name: "duplicate resourceVersion",
			h: history(
				hCreate(0, "k0", "w0-1", 0, 2, 10),
				hCreate(1, "k1", "w1-1", 1, 3, 10),
			),
			final:  map[string]FinalObject{"k0": {"w0-1", 10}, "k1": {"w1-1", 10}},
			badLin: true,
		},
		{
			name: "resourceVersion going back",
			h: history(
				hCreate(0, "k0", "w0-1", 0, 1, 10),
				hCreate(1, "k1", "w1-1", 2, 3, 9),
			),
			final:  map[string]FinalObject{"k0": {"w0-1", 10}, "k1": {"w1-1", 9}},
			badLin: true,
		},
		{
			name: "unknown create that happened",
			h: history(
				unknown(hCreate(0, "k0", "w0-1", 0, 5, 0)),
				hGet(1, "k0", 6, 7, "w0-1", 10),
				hUpdate(1, "k0", "w1-1", 10, 8, 9, 12),
				failed(hCreate(0, "k0", "w0-2", 10, 11, 0), 409),
			),
			final: map[string]FinalObject{"k0": {"w1-1", 12}},
		},
		{
			name: "unknown create that did not happen",
			h: history(
				unknown(hCreate(0, "k0", "w0-1", 0, 5, 0)),
				failed(hGet(1, "k0", 6, 7, "", 0), 404),
				hCreate(1, "k0", "w1-1", 8, 9, 11),
				hGet(0, "k0", 10, 11, "w1-1", 11),
			),
			final: map[string]FinalObject{"k0": {"w1-1", 11}},
		},
		{
			name: "unknown update that did and then did not happen",
			h: history(
				hCreate(0, "k0", "w0-1", 0, 1, 10),
				unknown(hUpdate(0, "k0", "w0-2", 10, 2, 5, 0)),
				hGet(1, "k0", 6, 7, "w0-2", 11),
				hGet(1, "k0", 8, 9, "w0-1", 10),
			),
			final:  map[string]FinalObject{"k0": {"w0-2", 11}},
			badLin: true,
		},
		{
			name: "unknown delete that may have happened",
			h: history(
				hCreate(0, "k0", "w0-1", 0, 1, 10),
				unknown(hDelete(0, "k0", 10, 2, 5)),
				hGet(1, "k0", 6, 7, "w0-1", 10),
				hList(1, 8, 9, 12),
			),
			final: map[string]FinalObject{},
		},
		{
			name: "list missing an acknowledged write",
			h: history(
				hCreate(0, "k0", "w0-1", 0, 1, 10),
				hList(1, 2, 3, 11),
			),
			final:   map[string]FinalObject{"k0": {"w0-1", 10}},
			badLin:  true,
			badList: true,
		},
		{
			name: "list that is no snapshot",
			h: history(
				hCreate(0, "k0", "w0-1", 0, 1, 10),
				hUpdate(0, "k0", "w0-2", 10, 2, 10, 15), // acknowledged after the list was sent
				hList(1, 3, 4, 20, Item{"k0", "w0-1", 10}),
			),
			final:   map[string]FinalObject{"k0": {"w0-2", 15}},
			badList: true,
		},
		{
			name: "list older than what was seen",
			h: history(
				hCreate(0, "k0", "w0-1", 0, 1, 10),
				hList(1, 2, 3, 9),
			),
			final:   map[string]FinalObject{"k0": {"w0-1", 10}},
			badLin:  true,
			badList: true,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			viz := filepath.Join(t.TempDir(), "viz.html")
			check := func(name string, err error, bad bool) {
				t.Helper()
				switch {
				case bad && err == nil:
					t.Errorf("%s passed a bad history", name)
				case !bad && err != nil:
					t.Errorf("%s failed a good history: %v", name, err)
				case err != nil:
					t.Logf("%s: %v", name, err)
				}
			}
			check("CheckLinearizable", CheckLinearizable(tc.h, 10*time.Second, viz), tc.badLin)
			check("CheckListFreshness", CheckListFreshness(tc.h), tc.badList)
			check("CheckNoLostWrites", CheckNoLostWrites(tc.h, tc.final), tc.badLost)
		})
	}
}

func TestCheckLinearizableWritesVisualization(t *testing.T) {
	h := history(
		hCreate(0, "k0", "w0-1", 0, 1, 10),
		hUpdate(0, "k0", "w0-2", 10, 2, 3, 11),
		hGet(1, "k0", 4, 5, "w0-1", 10),
		hCreate(1, "k1", "w1-1", 6, 7, 12),
	)
	viz := filepath.Join(t.TempDir(), "report", "viz.html")
	err := CheckLinearizable(h, 10*time.Second, viz)
	if err == nil {
		t.Fatal("a stale read passed")
	}
	if !strings.Contains(err.Error(), "key k0") || strings.Contains(err.Error(), "key k1") {
		t.Errorf("the error should name k0 only: %v", err)
	}
	if b, err := os.ReadFile(viz); err != nil || len(b) == 0 {
		t.Fatalf("no visualization: %v", err)
	}
}

func TestHistoryCounts(t *testing.T) {
	h := history(
		hCreate(0, "k0", "w0-1", 0, 1, 10),
		failed(hCreate(0, "k0", "w0-2", 2, 3, 0), 409),
		unknown(hUpdate(0, "k0", "w0-3", 10, 4, 5, 0)),
		hGet(0, "k0", 6, 7, "w0-1", 10),
		failed(hGet(0, "k1", 6, 7, "", 0), 404),
	)
	got := h.Counts()
	want := map[string]int{"create/ok": 1, "create/409": 1, "update/unknown": 1, "get/ok": 1, "get/404": 1}
	if len(got) != len(want) {
		t.Fatalf("counts %v, want %v", got, want)
	}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("counts %v, want %v", got, want)
		}
	}
}

// simulateHistory runs the traffic's mix of requests against a correct in-memory store in simulated time,
// with overlapping requests, and returns the history and the final state. unknownPct percent of the writes
// lose their answer: half of them take effect (some only after the client gave up), half never do.
// staleReadPct percent of the gets return the key's previous version: a bug the checks must find.
func simulateHistory(seed uint64, workers, opsPerWorker, unknownPct, staleReadPct int) (*History, map[string]FinalObject) {
	rng := rand.New(rand.NewPCG(seed, 7))
	const keys = 5
	type event struct {
		at    time.Duration
		seq   int
		kind  int // 0 call, 1 apply, 2 return
		w     int
		op    *Op
		apply bool
	}
	var queue []event
	seq := 0
	push := func(e event) {
		seq++
		e.seq = seq
		i := sort.Search(len(queue), func(i int) bool {
			return queue[i].at > e.at || (queue[i].at == e.at && queue[i].seq > e.seq)
		})
		queue = slices.Insert(queue, i, e)
	}
	us := func(lo, hi int) time.Duration { return time.Duration(lo+rng.IntN(hi-lo+1)) * time.Microsecond }

	var rev int64
	store := map[string]Item{}
	previous := map[string]Item{} // the version each key had before its current one
	type worker struct {
		left, writes int
		next         *Op // the write planned after a get
	}
	ws := make([]*worker, workers)
	h := &History{Namespace: "sim"}
	for w := range ws {
		ws[w] = &worker{left: opsPerWorker}
		push(event{at: us(0, 100), kind: 0, w: w})
	}
	for len(queue) > 0 {
		e := queue[0]
		queue = queue[1:]
		wk := ws[e.w]
		switch e.kind {
		case 0: // call
			op := wk.next
			wk.next = nil
			key := fmt.Sprintf("k%d", rng.IntN(keys))
			if op == nil {
				switch p := rng.IntN(100); {
				case p < 20:
					op = &Op{Kind: OpCreate, Key: key}
				case p < 75:
					op = &Op{Kind: OpGet, Key: key}
				default:
					op = &Op{Kind: OpList}
				}
			}
			if op.Kind == OpCreate || op.Kind == OpUpdate {
				wk.writes++
				op.Value = fmt.Sprintf("w%d-%d", e.w, wk.writes)
			}
			op.Worker, op.Call = e.w, e.at
			applyAt := e.at + us(1, 300)
			retAt := applyAt + us(1, 300)
			if op.isWrite() && rng.IntN(100) < unknownPct {
				op.Outcome = OutcomeUnknown
				switch rng.IntN(4) {
				case 0, 1: // never happens
				case 2:
					push(event{at: applyAt, kind: 1, w: e.w, op: op, apply: true})
				case 3: // happens after the client gave up
					push(event{at: retAt + us(1, 2000), kind: 1, w: e.w, op: op, apply: true})
				}
			} else {
				push(event{at: applyAt, kind: 1, w: e.w, op: op, apply: true})
			}
			push(event{at: retAt, kind: 2, w: e.w, op: op})
		case 1: // the store applies the request
			op := e.op
			cur, exists := store[op.Key]
			res := Op{Outcome: OutcomeOK}
			fail := func(code int, reason string) { res = Op{Outcome: OutcomeFailed, Code: code, Reason: reason} }
			switch op.Kind {
			case OpCreate:
				if exists {
					fail(409, "AlreadyExists")
					break
				}
				rev++
				store[op.Key] = Item{op.Key, op.Value, rev}
				res.RV, res.ReadValue = rev, op.Value
			case OpUpdate, OpDelete:
				switch {
				case !exists:
					fail(404, "NotFound")
				case cur.RV != op.PreconditionRV:
					fail(409, "Conflict")
				case op.Kind == OpDelete:
					rev++
					previous[op.Key] = cur
					delete(store, op.Key)
				default:
					rev++
					previous[op.Key] = cur
					store[op.Key] = Item{op.Key, op.Value, rev}
					res.RV, res.ReadValue = rev, op.Value
				}
			case OpGet:
				if prev, ok := previous[op.Key]; ok && rng.IntN(100) < staleReadPct {
					cur, exists = prev, true
				}
				if !exists {
					fail(404, "NotFound")
					break
				}
				res.Found, res.ReadValue, res.RV = true, cur.Value, cur.RV
			case OpList:
				for _, it := range store {
					res.Items = append(res.Items, it)
				}
				sort.Slice(res.Items, func(i, j int) bool { return res.Items[i].Key < res.Items[j].Key })
				res.RV = rev
			}
			if op.Outcome != OutcomeUnknown {
				op.Outcome, op.Code, op.Reason = res.Outcome, res.Code, res.Reason
				op.RV, op.Found, op.ReadValue, op.Items = res.RV, res.Found, res.ReadValue, res.Items
			}
		case 2: // the answer arrives
			op := e.op
			op.Return = e.at
			h.Ops = append(h.Ops, *op)
			if op.Kind == OpGet && op.Outcome == OutcomeOK {
				switch p := rng.IntN(100); {
				case p < 50:
					wk.next = &Op{Kind: OpUpdate, Key: op.Key, PreconditionRV: op.RV}
				case p < 60 && op.RV > 1:
					wk.next = &Op{Kind: OpUpdate, Key: op.Key, PreconditionRV: op.RV - 1, Stale: true}
				case p < 80:
					wk.next = &Op{Kind: OpDelete, Key: op.Key, PreconditionRV: op.RV}
				}
			}
			if wk.left--; wk.left > 0 || wk.next != nil {
				push(event{at: e.at + us(0, 50), kind: 0, w: e.w})
			}
		}
	}
	sort.SliceStable(h.Ops, func(i, j int) bool { return h.Ops[i].Call < h.Ops[j].Call })
	final := map[string]FinalObject{}
	for k, it := range store {
		final[k] = FinalObject{Value: it.Value, RV: it.RV}
	}
	return h, final
}

// TestChecksOnSimulatedStore runs the checks on histories of a correct store, which they must pass, with
// and without lost answers, and of stores with a bug, which they must catch.
func TestChecksOnSimulatedStore(t *testing.T) {
	for seed := uint64(1); seed <= 5; seed++ {
		h, final := simulateHistory(seed, 6, 400, 5, 0)
		counts := h.Counts()
		start := time.Now()
		if err := CheckLinearizable(h, 30*time.Second, ""); err != nil {
			t.Errorf("seed %d: CheckLinearizable failed a correct store: %v", seed, err)
		}
		took := time.Since(start)
		if err := CheckListFreshness(h); err != nil {
			t.Errorf("seed %d: CheckListFreshness failed a correct store: %v", seed, err)
		}
		if err := CheckNoLostWrites(h, final); err != nil {
			t.Errorf("seed %d: CheckNoLostWrites failed a correct store: %v", seed, err)
		}
		t.Logf("seed %d: %d ops, linearizability checked in %v: %v", seed, len(h.Ops), took.Round(time.Millisecond), counts)
	}

	t.Run("stale reads", func(t *testing.T) {
		h, _ := simulateHistory(11, 6, 400, 5, 3)
		if err := CheckLinearizable(h, 30*time.Second, ""); err == nil {
			t.Error("CheckLinearizable passed a store that serves stale reads")
		}
	})
	t.Run("lost write", func(t *testing.T) {
		h, final := simulateHistory(12, 6, 400, 0, 0)
		for k, fo := range final {
			final[k] = FinalObject{Value: fo.Value + "-lost", RV: fo.RV}
			break
		}
		if len(final) == 0 {
			t.Skip("the simulation ended with no objects")
		}
		if err := CheckNoLostWrites(h, final); err == nil {
			t.Error("CheckNoLostWrites passed a final state with a lost write")
		}
	})
	t.Run("stale lists", func(t *testing.T) {
		h, _ := simulateHistory(13, 6, 400, 0, 0)
		// Every list answers with the items of the list before it: an older snapshot.
		var prev []Item
		for i := range h.Ops {
			if op := &h.Ops[i]; op.Kind == OpList && op.Outcome == OutcomeOK {
				op.Items, prev = prev, op.Items
			}
		}
		if err := CheckListFreshness(h); err == nil {
			t.Error("CheckListFreshness passed lists that answer with older snapshots")
		}
	})
}

// TestUnknownWritesEndAtTheirFirstRead: an unknown write whose value a read returned ends when that read
// returned; one nobody read stays open to the end of time.
func TestUnknownWritesEndAtTheirFirstRead(t *testing.T) {
	h := history(
		unknown(hCreate(0, "k0", "w0-1", 0, 5, 0)),
		hGet(1, "k0", 6, 9, "w0-1", 10),
		hList(1, 7, 8, 10, Item{Key: "k0", Value: "w0-1", RV: 10}),
		unknown(hUpdate(2, "k0", "w2-1", 10, 10, 11, 0)),
	)
	_, parts := linPartitions(h)
	var returns []int64
	for _, op := range parts[0] {
		if op.Output.(linOutput).Unknown {
			returns = append(returns, op.Return)
		}
	}
	if len(returns) != 2 || returns[0] != int64(ms(8)) || returns[1] != math.MaxInt64 {
		t.Fatalf("unknown writes end at %v; want [8ms, never]", returns)
	}
}

// TestHistoryRoundTrip: a saved history loads back the same, for -chaos.recheck.
func TestHistoryRoundTrip(t *testing.T) {
	h := history(
		unknown(hCreate(0, "k0", "w0-1", 0, 5, 0)),
		hGet(1, "k0", 6, 9, "w0-1", 10),
		hList(1, 7, 8, 10, Item{Key: "k0", Value: "w0-1", RV: 10}),
	)
	path := filepath.Join(t.TempDir(), "h.json")
	if err := SaveHistory(h, path); err != nil {
		t.Fatal(err)
	}
	got, err := LoadHistory(path)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got.Ops) != fmt.Sprint(h.Ops) {
		t.Fatalf("loaded %v, saved %v", got.Ops, h.Ops)
	}
	if err := CheckLinearizable(got, time.Minute, ""); err != nil {
		t.Fatal(err)
	}
}

// TestUnseenUnknownWritesAreSettledByTheFinalState: with the final state known, an unknown create that no
// read returned and that is not final is left out (it never took effect); one whose value is final stays,
// open to the end of time; without a final state both stay.
func TestUnseenUnknownWritesAreSettledByTheFinalState(t *testing.T) {
	h := history(
		unknown(hCreate(0, "k0", "w0-1", 0, 5, 0)),
		unknown(hCreate(1, "k1", "w1-1", 0, 5, 0)),
		failed(hGet(2, "k0", 6, 7, "", 0), 404),
	)
	unknowns := func() map[string]int64 {
		keys, parts := linPartitions(h)
		out := map[string]int64{}
		for i, p := range parts {
			for _, op := range p {
				if op.Output.(linOutput).Unknown {
					out[keys[i]] = op.Return
				}
			}
		}
		return out
	}
	if got := unknowns(); len(got) != 2 {
		t.Fatalf("without a final state: %v, want both unknown creates", got)
	}
	h.Final = map[string]FinalObject{"k1": {Value: "w1-1", RV: 12}}
	got := unknowns()
	if _, ok := got["k0"]; ok || got["k1"] != math.MaxInt64 {
		t.Fatalf("with the final state: %v, want only k1's create, open", got)
	}
	if err := CheckLinearizable(h, 10*time.Second, ""); err != nil {
		t.Fatal(err)
	}
}
