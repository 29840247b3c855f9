package fsm

import (
	"bytes"
	"testing"
)

func TestStateHashEqualAcrossReplicas(t *testing.T) {
	for seed := int64(1); seed <= 10; seed++ {
		log := randomCommands(seed, 1000)
		var indexes [3]uint64
		var hashes [3]string
		for replica := range hashes {
			a := newApplier(Options{HistoryEvents: 50 * (replica + 1)}) // history is local, not state
			// The same log in different batch sizes, as Raft may deliver it.
			for i := 0; i < len(log); {
				n := 1 + (i*5+replica)%13
				var batch []Entry
				for j := 0; j < n && i < len(log); j++ {
					a.index++
					batch = append(batch, Entry{Index: a.index, Data: log[i].Encode()})
					i++
				}
				a.s.ApplyBatch(batch)
			}
			indexes[replica], hashes[replica] = a.s.StateHash()
		}
		if indexes[0] != uint64(len(log)) || indexes[1] != indexes[0] || indexes[2] != indexes[0] {
			t.Fatalf("seed %d: applied indexes %v, want all %d", seed, indexes, len(log))
		}
		if hashes[1] != hashes[0] || hashes[2] != hashes[0] {
			t.Fatalf("seed %d: replicas hash differently: %v", seed, hashes)
		}
		if len(hashes[0]) != 64 {
			t.Fatalf("hash %q is not hex SHA-256", hashes[0])
		}
	}
}

// TestStateHashSeesEveryDifference: stores that differ in one key, one value, one per-key revision, one
// expiry or the store revision hash differently; the watch history does not count.
func TestStateHashSeesEveryDifference(t *testing.T) {
	create := func(key, value string) Command {
		return Command{Type: CmdCreate, Key: key, Value: []byte(value)}
	}
	noop := Command{Type: CmdNoop}
	cases := []struct {
		name  string
		a, b  []Command
		equal bool
	}{
		{name: "same", a: []Command{create("/a", "1"), create("/b", "2")}, b: []Command{create("/a", "1"), create("/b", "2")}, equal: true},
		{name: "value", a: []Command{create("/a", "1"), create("/b", "2")}, b: []Command{create("/a", "1"), create("/b", "3")}},
		{name: "key", a: []Command{create("/a", "1"), create("/b", "2")}, b: []Command{create("/a", "1"), create("/c", "2")}},
		{name: "key and value boundary", a: []Command{create("/a", "bc")}, b: []Command{create("/ab", "c")}},
		{name: "empty value", a: []Command{create("/a", "")}, b: []Command{create("/a", "x")}},
		// Same keys, values, store revision and applied index; only the keys' create and mod revisions differ.
		{name: "per-key revisions", a: []Command{create("/a", "1"), noop}, b: []Command{noop, create("/a", "1")}},
		{name: "mod revision only", a: []Command{create("/a", "1"), {Type: CmdUpdate, Key: "/a", Value: []byte("1")}, noop},
			b: []Command{create("/a", "1"), noop, {Type: CmdUpdate, Key: "/a", Value: []byte("1")}}},
		{name: "expiry", a: []Command{create("/a", "1")}, b: []Command{{Type: CmdCreate, Key: "/a", Value: []byte("1"), ExpiresAt: 5}}},
		{name: "store revision", a: []Command{create("/a", "1"), noop}, b: []Command{create("/a", "1"), {Type: CmdDelete, Key: "/missing"}}},
		// A compaction drops watch history only, but it moves the revision as etcd's does.
		{name: "compaction", a: []Command{create("/a", "1"), noop}, b: []Command{create("/a", "1"), {Type: CmdCompact, CompactRevision: 1}}, equal: true},
		// A deleted key leaves nothing in the state: no tombstones.
		{name: "created then deleted", a: []Command{noop, noop}, b: []Command{create("/a", "1"), {Type: CmdDelete, Key: "/a"}}, equal: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newApplier(Options{}), newApplier(Options{HistoryEvents: 1})
			for _, c := range tc.a {
				a.apply(c)
			}
			for _, c := range tc.b {
				b.apply(c)
			}
			ia, ha := a.s.StateHash()
			ib, hb := b.s.StateHash()
			if ia != ib {
				t.Fatalf("applied indexes %d and %d; the cases keep them equal", ia, ib)
			}
			if (ha == hb) != tc.equal {
				t.Fatalf("hashes %s and %s, want equal=%v", ha, hb, tc.equal)
			}
		})
	}
}

func TestStateHashSurvivesSnapshotRestore(t *testing.T) {
	a := newApplier(Options{})
	for _, c := range randomCommands(7, 1500) {
		a.apply(c)
	}
	wantIndex, want := a.s.StateHash()
	var buf bytes.Buffer
	if _, err := a.s.Snapshot().WriteTo(&buf); err != nil {
		t.Fatal(err)
	}

	fresh := New(Options{HistoryEvents: 10})
	if err := fresh.Restore(bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	if index, got := fresh.StateHash(); index != wantIndex || got != want {
		t.Fatalf("restored into a fresh store: (%d, %s), want (%d, %s)", index, got, wantIndex, want)
	}

	// A store with other state of its own, behind the snapshot, ends up with the snapshot's state exactly.
	behind := newApplier(Options{})
	for _, c := range randomCommands(8, 300) {
		behind.apply(c)
	}
	if err := behind.s.Restore(bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	if index, got := behind.s.StateHash(); index != wantIndex || got != want {
		t.Fatalf("restored over older state: (%d, %s), want (%d, %s)", index, got, wantIndex, want)
	}

	// Both go on applying the same log and stay equal.
	next := randomCommands(9, 200)
	b := &applier{s: fresh, index: wantIndex, now: a.now}
	for _, c := range next {
		a.apply(c)
		b.apply(c)
	}
	ia, ha := a.s.StateHash()
	ib, hb := b.s.StateHash()
	if ia != ib || ha != hb {
		t.Fatalf("after more entries: (%d, %s) and (%d, %s)", ia, ha, ib, hb)
	}
}

// TestStateHashMatchesItsIndex: a hash taken while entries are being applied is the hash of the state at the
// index reported with it.
func TestStateHashMatchesItsIndex(t *testing.T) {
	log := randomCommands(3, 600)
	ref := newApplier(Options{})
	want := map[uint64]string{}
	for _, c := range log {
		ref.apply(c)
		i, h := ref.s.StateHash()
		want[i] = h
	}

	a := newApplier(Options{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, c := range log {
			a.apply(c)
		}
	}()
	for {
		select {
		case <-done:
			index, hash := a.s.StateHash()
			if hash != want[index] {
				t.Fatalf("final hash at %d differs", index)
			}
			return
		default:
		}
		index, hash := a.s.StateHash()
		if index == 0 {
			continue
		}
		if hash != want[index] {
			t.Fatalf("hash at index %d is %s, the state at that index hashes %s", index, hash, want[index])
		}
	}
}
