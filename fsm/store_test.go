package fsm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"
)

// applier feeds commands to a store with consecutive Raft indexes, as the Raft FSM loop does.
type applier struct {
	s     *Store
	index uint64
	now   int64
}

func newApplier(opts Options) *applier {
	return &applier{s: New(opts), now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()}
}

func (a *applier) apply(c Command) Result {
	a.index++
	if c.Time == 0 {
		c.Time = a.now
	}
	return a.s.Apply(a.index, c.Encode())
}

func TestCommands(t *testing.T) {
	cases := []struct {
		name    string
		setup   []Command
		cmd     Command
		wantErr error
		wantVal string // value of KV in the result
	}{
		{name: "create", cmd: Command{Type: CmdCreate, Key: "/a", Value: []byte("1")}, wantVal: "1"},
		{name: "create existing", setup: []Command{{Type: CmdCreate, Key: "/a", Value: []byte("1")}},
			cmd: Command{Type: CmdCreate, Key: "/a", Value: []byte("2")}, wantErr: ErrAlreadyExists, wantVal: "1"},
		{name: "update", setup: []Command{{Type: CmdCreate, Key: "/a", Value: []byte("1")}},
			cmd: Command{Type: CmdUpdate, Key: "/a", Value: []byte("2")}, wantVal: "2"},
		{name: "update at expected revision", setup: []Command{{Type: CmdCreate, Key: "/a", Value: []byte("1")}},
			cmd: Command{Type: CmdUpdate, Key: "/a", Value: []byte("2"), ExpectedModRevision: 1}, wantVal: "2"},
		{name: "update conflict returns current", setup: []Command{{Type: CmdCreate, Key: "/a", Value: []byte("1")}},
			cmd: Command{Type: CmdUpdate, Key: "/a", Value: []byte("2"), ExpectedModRevision: 7}, wantErr: ErrConflict, wantVal: "1"},
		{name: "update missing", cmd: Command{Type: CmdUpdate, Key: "/a", Value: []byte("2")}, wantErr: ErrNotFound},
		{name: "delete", setup: []Command{{Type: CmdCreate, Key: "/a", Value: []byte("1")}},
			cmd: Command{Type: CmdDelete, Key: "/a"}, wantVal: "1"},
		{name: "delete conflict returns current", setup: []Command{{Type: CmdCreate, Key: "/a", Value: []byte("1")}},
			cmd: Command{Type: CmdDelete, Key: "/a", ExpectedModRevision: 9}, wantErr: ErrConflict, wantVal: "1"},
		{name: "delete missing", cmd: Command{Type: CmdDelete, Key: "/a"}, wantErr: ErrNotFound},
		{name: "txn without body", cmd: Command{Type: CmdTxn}, wantErr: ErrInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := newApplier(Options{})
			for _, c := range tc.setup {
				if err := a.apply(c).Err(); err != nil {
					t.Fatalf("setup: %v", err)
				}
			}
			res := a.apply(tc.cmd)
			if !errors.Is(res.Err(), tc.wantErr) || (tc.wantErr == nil) != (res.Err() == nil) {
				t.Fatalf("err = %v, want %v", res.Err(), tc.wantErr)
			}
			if tc.wantVal != "" && (res.KV == nil || string(res.KV.Value) != tc.wantVal) {
				t.Fatalf("result KV = %+v, want value %q", res.KV, tc.wantVal)
			}
		})
	}
}

func TestRevisions(t *testing.T) {
	a := newApplier(Options{})
	a.apply(Command{Type: CmdCreate, Key: "/a", Value: []byte("1")})        // 1
	a.apply(Command{Type: CmdCreate, Key: "/b", Value: []byte("1")})        // 2
	res := a.apply(Command{Type: CmdUpdate, Key: "/a", Value: []byte("2")}) // 3
	if res.KV.CreateRevision != 1 || res.KV.ModRevision != 3 || res.Revision != 3 {
		t.Fatalf("revisions = %+v, store %d", res.KV, res.Revision)
	}
	// A failed command does not move the revision.
	if res := a.apply(Command{Type: CmdCreate, Key: "/a"}); res.Revision != 3 {
		t.Fatalf("failed create moved revision to %d", res.Revision)
	}
	// A no-op does: it is the new leader's barrier.
	if res := a.apply(Command{Type: CmdNoop}); res.Revision != 5 {
		t.Fatalf("noop revision = %d, want 5", res.Revision)
	}
	kv, rev, err := a.s.Get("/a")
	if err != nil || rev != 5 || kv.ModRevision != 3 {
		t.Fatalf("Get = %+v %d %v", kv, rev, err)
	}
}

func TestTxnAtomicity(t *testing.T) {
	a := newApplier(Options{})
	a.apply(Command{Type: CmdCreate, Key: "/quota", Value: []byte("1")})
	bind := func(cmpRev int64) Result {
		return a.apply(Command{Type: CmdTxn, Txn: &Txn{
			Compares: []Compare{{Key: "/quota", Target: CompareModRevision, Result: CompareEqual, Revision: cmpRev}},
			Success: []Op{
				{Type: OpPut, Key: "/quota", Value: []byte("2")},
				{Type: OpPut, Key: "/pods/a", Value: []byte("bound")},
				{Type: OpDelete, Key: "/pending/a"},
			},
			Failure: []Op{{Type: OpGet, Key: "/quota"}},
		}})
	}
	res := bind(99)
	if res.Succeeded || len(res.Responses) != 1 || string(res.Responses[0].Value) != "1" {
		t.Fatalf("failed txn = %+v", res)
	}
	if _, _, err := a.s.Get("/pods/a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("failed txn wrote: %v", err)
	}
	res = bind(1)
	if !res.Succeeded {
		t.Fatalf("txn did not succeed: %+v", res)
	}
	for _, k := range []string{"/quota", "/pods/a"} {
		kv, _, err := a.s.Get(k)
		if err != nil || kv.ModRevision != 3 {
			t.Fatalf("%s = %+v, %v; want mod revision 3", k, kv, err)
		}
	}
	// Compare on a missing key: create revision 0 means absent.
	res = a.apply(Command{Type: CmdTxn, Txn: &Txn{
		Compares: []Compare{{Key: "/nope", Target: CompareCreateRevision, Result: CompareEqual, Revision: 0},
			{Key: "/quota", Target: CompareValue, Result: CompareEqual, Value: []byte("2")}},
		Success: []Op{{Type: OpPut, Key: "/nope", Value: []byte("x")}},
	}})
	if !res.Succeeded {
		t.Fatal("compare on absent key failed")
	}
}

func TestRangeAndCount(t *testing.T) {
	a := newApplier(Options{})
	for i := 0; i < 10; i++ {
		a.apply(Command{Type: CmdCreate, Key: fmt.Sprintf("/registry/pods/default/p%d", i), Value: []byte("v")})
	}
	a.apply(Command{Type: CmdCreate, Key: "/registry/pods0", Value: []byte("not under the prefix")})
	prefix := "/registry/pods/"
	var got []string
	start := ""
	for pages := 0; ; pages++ {
		page := a.s.Range(prefix, start, 3)
		if page.Revision != 11 {
			t.Fatalf("page revision = %d", page.Revision)
		}
		for _, kv := range page.KVs {
			got = append(got, kv.Key)
		}
		if !page.More {
			break
		}
		start = page.KVs[len(page.KVs)-1].Key + "\x00"
		if pages > 5 {
			t.Fatal("paging does not end")
		}
	}
	if len(got) != 10 {
		t.Fatalf("ranged %d keys: %v", len(got), got)
	}
	if n, _ := a.s.Count(prefix); n != 10 {
		t.Fatalf("count = %d", n)
	}
}

func TestWatchReplayThenLive(t *testing.T) {
	a := newApplier(Options{})
	for i := 0; i < 5; i++ {
		a.apply(Command{Type: CmdCreate, Key: fmt.Sprintf("/w/%d", i), Value: []byte("v")})
		a.apply(Command{Type: CmdCreate, Key: fmt.Sprintf("/other/%d", i), Value: []byte("v")})
	}
	w, err := a.s.Watch("/w/", 4) // revisions 5, 7, 9 are under /w/ and after 4
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := make(chan []int64)
	go func() {
		var revs []int64
		for len(revs) < 6 {
			evs, err := w.Next(ctx)
			if err != nil {
				t.Error(err)
				break
			}
			for _, ev := range evs {
				revs = append(revs, ev.Revision)
			}
		}
		done <- revs
	}()
	// Live writes race with the replay: no gap and no duplicate either way.
	for i := 5; i < 8; i++ {
		a.apply(Command{Type: CmdCreate, Key: fmt.Sprintf("/w/%d", i), Value: []byte("v")})
	}
	revs := <-done
	want := []int64{5, 7, 9, 11, 12, 13}
	if fmt.Sprint(revs) != fmt.Sprint(want) {
		t.Fatalf("revisions = %v, want %v", revs, want)
	}
}

func TestWatchCompacted(t *testing.T) {
	a := newApplier(Options{HistoryEvents: 4})
	for i := 0; i < 10; i++ {
		a.apply(Command{Type: CmdCreate, Key: fmt.Sprintf("/k/%d", i)})
	}
	if _, err := a.s.Watch("/k/", 2); !errors.Is(err, ErrCompacted) {
		t.Fatalf("watch from evicted revision: %v", err)
	}
	if _, err := a.s.Watch("/k/", 6); err != nil {
		t.Fatalf("watch inside history: %v", err)
	}
	// Age: events proposed more than HistoryAge before the latest entry are dropped.
	b := newApplier(Options{HistoryAge: time.Minute})
	b.apply(Command{Type: CmdCreate, Key: "/k/old"})
	b.now += int64(2 * time.Minute)
	b.apply(Command{Type: CmdCreate, Key: "/k/new"})
	if _, err := b.s.Watch("/k/", 0); !errors.Is(err, ErrCompacted) {
		t.Fatalf("watch from aged-out revision: %v", err)
	}
	if got := b.s.CompactedRevision(); got != 1 {
		t.Fatalf("compacted revision = %d, want 1", got)
	}
}

func TestCompactCommand(t *testing.T) {
	a := newApplier(Options{})
	for i := 0; i < 5; i++ {
		a.apply(Command{Type: CmdCreate, Key: fmt.Sprintf("/k/%d", i)})
	}
	a.apply(Command{Type: CmdCompact, CompactRevision: 3})
	if _, err := a.s.Watch("/k/", 2); !errors.Is(err, ErrCompacted) {
		t.Fatalf("watch below the compaction: %v", err)
	}
	if _, err := a.s.Watch("/k/", 3); err != nil {
		t.Fatalf("watch at the compaction: %v", err)
	}
	if n, _ := a.s.Count("/k/"); n != 5 || a.s.CompactedRevision() != 3 {
		t.Fatalf("compaction changed keys (%d) or did not record revision (%d)", n, a.s.CompactedRevision())
	}
}

func TestSlowWatcherIsCutOff(t *testing.T) {
	a := newApplier(Options{HistoryEvents: 8})
	w, err := a.s.Watch("/", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for i := 0; i < 20; i++ {
		a.apply(Command{Type: CmdCreate, Key: fmt.Sprintf("/k/%d", i)})
	}
	_, err = w.Next(context.Background())
	if !errors.Is(err, ErrFallenBehind) || !errors.Is(err, ErrCompacted) {
		t.Fatalf("slow watcher got %v, want ErrFallenBehind", err)
	}
}

func TestProgressNotification(t *testing.T) {
	a := newApplier(Options{})
	w, err := a.s.Watch("/quiet/", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for i := 0; i < 3; i++ {
		a.apply(Command{Type: CmdCreate, Key: fmt.Sprintf("/busy/%d", i)})
	}
	w.RequestProgress()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	evs, err := w.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 || evs[0].Type != EventProgress || evs[0].Revision != 3 {
		t.Fatalf("events = %+v, want one progress at 3", evs)
	}
}

func TestExpired(t *testing.T) {
	a := newApplier(Options{})
	a.apply(Command{Type: CmdCreate, Key: "/events/a", ExpiresAt: 100})
	a.apply(Command{Type: CmdCreate, Key: "/events/b", ExpiresAt: 200})
	a.apply(Command{Type: CmdCreate, Key: "/events/c"})
	got := a.s.Expired(150, 10)
	if len(got) != 1 || got[0].Key != "/events/a" {
		t.Fatalf("expired = %+v", got)
	}
	// A refresh moves the expiry; the old deadline no longer applies.
	a.apply(Command{Type: CmdUpdate, Key: "/events/a", ExpiresAt: 300})
	if got := a.s.Expired(250, 10); len(got) != 1 || got[0].Key != "/events/b" {
		t.Fatalf("after refresh expired = %+v", got)
	}
}

func TestSnapshotRoundTrip(t *testing.T) {
	a := newApplier(Options{})
	for i := 0; i < 100; i++ {
		a.apply(Command{Type: CmdCreate, Key: fmt.Sprintf("/registry/pods/ns/%03d", i), Value: bytes.Repeat([]byte{byte(i)}, i), ExpiresAt: int64(i % 3)})
	}
	w, _ := a.s.Watch("/", 0)
	defer w.Close()
	var buf bytes.Buffer
	if _, err := a.s.Snapshot().WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	info, err := InspectSnapshot(bytes.NewReader(buf.Bytes()))
	if err != nil || info.Keys != 100 || info.Revision != 100 || len(info.Prefixes) != 1 || info.Prefixes[0].Keys != 100 {
		t.Fatalf("inspect = %+v, %v", info, err)
	}
	b := newApplier(Options{})
	if err := b.s.Restore(bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	var again bytes.Buffer
	b.s.Snapshot().WriteTo(&again)
	if !bytes.Equal(buf.Bytes(), again.Bytes()) {
		t.Fatal("restored store snapshots differently")
	}
	if b.s.Revision() != 100 || len(b.s.Expired(2, 1000)) != 66 {
		t.Fatalf("restored revision %d, expiring %d", b.s.Revision(), len(b.s.Expired(2, 1000)))
	}
	// Restore ends open watchers with Compacted.
	if err := a.s.Restore(bytes.NewReader(buf.Bytes())); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Next(context.Background()); !errors.Is(err, ErrCompacted) {
		t.Fatalf("watcher after restore: %v", err)
	}
}

func TestCorruptSnapshotRefused(t *testing.T) {
	a := newApplier(Options{})
	for i := 0; i < 20; i++ {
		a.apply(Command{Type: CmdCreate, Key: fmt.Sprintf("/k/%02d", i), Value: []byte("value")})
	}
	var buf bytes.Buffer
	a.s.Snapshot().WriteTo(&buf)
	good := buf.Bytes()
	flipped := append([]byte(nil), good...)
	flipped[len(flipped)/2] ^= 0x40
	cases := []struct {
		name string
		data []byte
	}{
		{"empty", nil},
		{"bad magic", append([]byte("NOTSKIFF"), good[8:]...)},
		{"truncated", good[:len(good)-10]},
		{"truncated in header", good[:9]},
		{"flipped byte", flipped},
		{"trailing garbage", append(append([]byte(nil), good...), 1, 2, 3)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := newApplier(Options{})
			b.apply(Command{Type: CmdCreate, Key: "/keep", Value: []byte("me")})
			err := b.s.Restore(bytes.NewReader(tc.data))
			if !errors.Is(err, ErrCorruptSnapshot) {
				t.Fatalf("restore error = %v, want ErrCorruptSnapshot", err)
			}
			if _, _, err := b.s.Get("/keep"); err != nil {
				t.Fatal("refused restore changed the store")
			}
		})
	}
}

// TestNewerSnapshotRefused: a snapshot whose format version is newer than this binary's is refused with its
// own error, and the store is left as it was.
func TestNewerSnapshotRefused(t *testing.T) {
	a := newApplier(Options{})
	a.apply(Command{Type: CmdCreate, Key: "/k", Value: []byte("value")})
	var buf bytes.Buffer
	a.s.Snapshot().WriteTo(&buf)
	newer := append([]byte(nil), buf.Bytes()...)
	newer[len(snapshotMagic)] = snapshotVersion + 1 // the version is the uvarint after the magic
	b := newApplier(Options{})
	b.apply(Command{Type: CmdCreate, Key: "/keep", Value: []byte("me")})
	err := b.s.Restore(bytes.NewReader(newer))
	if !errors.Is(err, ErrNewerSnapshot) || !strings.Contains(err.Error(), "newer than this skiff reads") {
		t.Fatalf("restore error = %v, want ErrNewerSnapshot", err)
	}
	if _, _, err := b.s.Get("/keep"); err != nil {
		t.Fatal("refused restore changed the store")
	}
}

// randomCommands builds a log that exercises every command type, including failing ones.
func randomCommands(seed int64, n int) []Command {
	r := rand.New(rand.NewSource(seed))
	key := func() string { return fmt.Sprintf("/registry/things/ns/%d", r.Intn(50)) }
	var out []Command
	for i := 0; i < n; i++ {
		val := []byte(fmt.Sprint(r.Int63()))
		switch r.Intn(5) {
		case 0:
			out = append(out, Command{Type: CmdCreate, Key: key(), Value: val, ExpiresAt: int64(r.Intn(3)) * 1000})
		case 1:
			out = append(out, Command{Type: CmdUpdate, Key: key(), Value: val, ExpectedModRevision: int64(r.Intn(i + 1))})
		case 2:
			out = append(out, Command{Type: CmdDelete, Key: key(), ExpectedModRevision: int64(r.Intn(2) * r.Intn(i+1))})
		case 3:
			out = append(out, Command{Type: CmdTxn, Txn: &Txn{
				Compares: []Compare{{Key: key(), Target: CompareCreateRevision, Result: CompareResult(1 + r.Intn(4)), Revision: int64(r.Intn(i + 1))}},
				Success:  []Op{{Type: OpPut, Key: key(), Value: val}, {Type: OpDelete, Key: key()}},
				Failure:  []Op{{Type: OpGet, Key: key()}, {Type: OpPut, Key: key(), Value: val}},
			}})
		case 4:
			out = append(out, Command{Type: CmdNoop})
		}
		out[i].Time = int64(i) * int64(time.Millisecond)
	}
	return out
}

func TestDeterminismAcrossReplicas(t *testing.T) {
	for seed := int64(1); seed <= 20; seed++ {
		log := randomCommands(seed, 2000)
		var snaps [3][]byte
		for replica := range snaps {
			a := newApplier(Options{HistoryEvents: 100 * (replica + 1)}) // history size is local, not state
			// Replicas apply the same log in different batch sizes, as Raft may deliver it.
			for i := 0; i < len(log); {
				n := 1 + (i*7+replica)%17
				var batch []Entry
				for j := 0; j < n && i < len(log); j++ {
					a.index++
					batch = append(batch, Entry{Index: a.index, Data: log[i].Encode()})
					i++
				}
				a.s.ApplyBatch(batch)
			}
			var buf bytes.Buffer
			a.s.Snapshot().WriteTo(&buf)
			snaps[replica] = buf.Bytes()
		}
		if !bytes.Equal(snaps[0], snaps[1]) || !bytes.Equal(snaps[0], snaps[2]) {
			t.Fatalf("seed %d: replicas diverged", seed)
		}
	}
}

func TestCommandCodecRejectsGarbage(t *testing.T) {
	good := (&Command{Type: CmdTxn, Txn: &Txn{Success: []Op{{Type: OpPut, Key: "/a"}}}}).Encode()
	for _, data := range [][]byte{nil, {1}, {99, 1}, {byte(CmdCreate), 9}, good[:len(good)-1], append(append([]byte(nil), good...), 0)} {
		if _, err := DecodeCommand(data); err == nil {
			t.Errorf("DecodeCommand(%v) accepted garbage", data)
		}
	}
	res := Result{Revision: 7, Code: CodeConflict, KV: &KeyValue{Key: "/a", Value: []byte("x"), ModRevision: 3}, Responses: []*KeyValue{nil, {Key: "/b"}}}
	back, err := DecodeResult(EncodeResult(res))
	if err != nil || fmt.Sprint(back.KV) != fmt.Sprint(res.KV) || len(back.Responses) != 2 || back.Responses[0] != nil {
		t.Fatalf("result round trip = %+v, %v", back, err)
	}
}

func FuzzDecodeCommand(f *testing.F) {
	f.Add((&Command{Type: CmdCreate, Key: "/a", Value: []byte("v")}).Encode())
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := DecodeCommand(data)
		if err != nil {
			return
		}
		again, err := DecodeCommand(c.Encode())
		if err != nil || !bytes.Equal(again.Encode(), c.Encode()) {
			t.Fatalf("re-encoding is not stable: %v", err)
		}
	})
}
