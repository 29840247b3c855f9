package raftnode_test

// Regression tests for open hashicorp/raft v1.7.3 issues that Skiff works around (see upstream.go):
// #695 (a stale leader writes in a newer term), #696 (a leader stuck refusing writes after an interrupted
// leadership transfer) and #697 (a follower livelocked on snapshot installs).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/skiff-dev/skiff/fsm"
	"github.com/skiff-dev/skiff/raftnode"
	rt "github.com/skiff-dev/skiff/raftnode/raftnodetest"
)

func addrOf(c *rt.Cluster, i int) string { return c.Config(i).BindAddr }

func others(c *rt.Cluster, i int) []string {
	var out []string
	for j := 0; j < c.Size(); j++ {
		if j != i {
			out = append(out, addrOf(c, j))
		}
	}
	return out
}

// waitSameLastIndex waits until every running peer's Raft log ends at the same index.
func waitSameLastIndex(c *rt.Cluster) uint64 {
	var last uint64
	c.WaitFor("every peer at the same last index", 10*time.Second, func() error {
		for i := 0; i < c.Size(); i++ {
			l := c.Node(i).RaftForTest().LastIndex()
			if i == 0 {
				last = l
			} else if l != last {
				return fmt.Errorf("peer %d at %d, peer 0 at %d", i, l, last)
			}
		}
		return nil
	})
	return last
}

// waitLeaderAmong waits until one of the given peers leads and returns it.
func waitLeaderAmong(c *rt.Cluster, peers ...int) int {
	leader := -1
	c.WaitFor("a leader among the majority", 10*time.Second, func() error {
		for _, i := range peers {
			if c.Node(i).IsLeader() {
				leader = i
				return nil
			}
		}
		return fmt.Errorf("no leader among %v", peers)
	})
	return leader
}

// saveAndRestore saves peer n's snapshot to a file and restores the cluster from it through n, as an operator's
// backup and restore would.
func saveAndRestore(t *testing.T, n *raftnode.Node) error {
	path := filepath.Join(t.TempDir(), "backup.snap")
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := n.SaveSnapshot(ctx, f); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	_, err = n.RestoreSnapshot(ctx, path)
	return err
}

// putVia writes key=value through peer i and returns the write's revision (its Raft index).
func putVia(t *testing.T, c *rt.Cluster, i int, key, value string) int64 {
	t.Helper()
	res, err := c.Put(i, key, value)
	if err != nil {
		t.Fatalf("write %s through peer %d: %v", key, i, err)
	}
	return res.Revision
}

// waitApplied waits until every peer's store has applied index.
func waitApplied(c *rt.Cluster, index uint64, timeout time.Duration) {
	c.WaitFor(fmt.Sprintf("every peer to apply index %d", index), timeout, func() error {
		for i := 0; i < c.Size(); i++ {
			n := c.Node(i)
			if got := n.Store().AppliedIndex(); got < index {
				st := n.Stats()
				return fmt.Errorf("peer %d applied %d (log %d-%d, snapshot installs %d)", i, got,
					st["first_log_index"], st["last_log_index"], st["snapshot_installs"])
			}
		}
		return nil
	})
}

// checkLogMatching fails the test if two peers hold different entries with the same index and term: Raft's
// Log Matching property.
func checkLogMatching(t *testing.T, c *rt.Cluster) {
	t.Helper()
	type span struct{ first, last uint64 }
	spans := make([]span, c.Size())
	for i := range spans {
		first, last, err := c.Node(i).LogBoundsForTest()
		if err != nil {
			t.Fatal(err)
		}
		spans[i] = span{first, last}
	}
	for i := 0; i < c.Size(); i++ {
		for j := i + 1; j < c.Size(); j++ {
			lo, hi := max(spans[i].first, spans[j].first), min(spans[i].last, spans[j].last)
			for idx := lo; lo > 0 && idx <= hi; idx++ {
				a, errA := c.Node(i).LogForTest(idx)
				b, errB := c.Node(j).LogForTest(idx)
				if errA != nil || errB != nil || a.Term != b.Term {
					continue
				}
				if a.Type != b.Type || !bytes.Equal(a.Data, b.Data) {
					t.Errorf("Log Matching violated at index %d term %d: peer %d holds %v %q, peer %d holds %v %q",
						idx, a.Term, i, a.Type, a.Data, j, b.Type, b.Data)
				}
			}
		}
	}
}

func checkAbsent(t *testing.T, c *rt.Cluster, key, why string) {
	t.Helper()
	for i := 0; i < c.Size(); i++ {
		if _, _, err := c.Node(i).Store().Get(key); !errors.Is(err, fsm.ErrNotFound) {
			t.Errorf("peer %d holds %s, %s", i, key, why)
		}
	}
}

// TestStaleLeaderNeverAppendsInANewerTerm is hashicorp/raft#695. The NetworkTransport handles a heartbeat
// (an AppendEntries without entries) on its connection goroutine, outside Raft's main loop, and a heartbeat
// from a newer term moves the term and state of the peer under the main loop's feet. A leader whose main
// loop sits idle while the heartbeat of a newer leader arrives (a process paused across an election, then
// resumed as the partition heals) then takes the next write queued to it and appends it in the NEW term. The
// new leader holds a different entry at that index in that same term; when it replicates, the old leader
// keeps its own entry as a "duplicate" and applies a write nobody committed.
//
// The test plays the interleaving with a real cluster: A leads term T; its own dials fail from then on (B and
// C stop hearing from it, but it keeps its lease for a second); B's heartbeat of term T+1 reaches A before
// anything else from B (B heartbeats every HeartbeatTimeout/10 on connections of its own); C, still following
// A, forwards a write to it. Then B is elected in T+1 and the partition heals. No peer may apply that write,
// and the logs must agree. (The heartbeat is sent before B's election rather than after it: A cannot tell the
// difference, and the interleaving stays deterministic without pausing A's process, which is how a leader
// outlives its lease across a newer leader's election in production.)
func TestStaleLeaderNeverAppendsInANewerTerm(t *testing.T) {
	c := rt.TestCluster(t, 3, func(cfg *raftnode.Config) {
		// A second of lease: the stale leader keeps leading while the test plays the interleaving.
		cfg.HeartbeatTimeout, cfg.ElectionTimeout, cfg.LeaderLeaseTimeout = time.Second, time.Second, time.Second
	})
	a := c.WaitForLeader()
	b, cc := (a+1)%3, (a+2)%3
	A, B, C := c.Node(a), c.Node(b), c.Node(cc)
	for i := 0; i < 3; i++ {
		putVia(t, c, a, fmt.Sprintf("/k/%d", i), "v")
	}
	waitSameLastIndex(c)
	term := A.RaftForTest().CurrentTerm()

	// A can no longer reach B or C; they can still reach A.
	c.Net.Block([]string{addrOf(c, a)}, []string{addrOf(c, b), addrOf(c, cc)})

	// B's heartbeat of term T+1 reaches A.
	hb := &raft.AppendEntriesRequest{RPCHeader: B.RPCHeaderForTest(), Term: term + 1}
	if err := B.TransportForTest().AppendEntries(raft.ServerID(A.ID()), raft.ServerAddress(A.Addr()), hb, &raft.AppendEntriesResponse{}); err != nil {
		t.Fatalf("heartbeat to the old leader: %v", err)
	}
	// C, which still follows A, forwards a write to it. Its outcome is unknown to C, but it must not commit.
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	_, err := C.Apply(ctx, &fsm.Command{Type: fsm.CmdTxn, Txn: &fsm.Txn{Success: []fsm.Op{{Type: fsm.OpPut, Key: "/x", Value: []byte("from the stale leader")}}}})
	cancel()
	t.Logf("write forwarded to the stale leader: %v", err)

	// B and C elect B in term T+1, without A.
	c.Net.Partition([]string{addrOf(c, a)}, others(c, a))
	if err := C.TransportForTest().TimeoutNow(raft.ServerID(B.ID()), raft.ServerAddress(B.Addr()),
		&raft.TimeoutNowRequest{RPCHeader: C.RPCHeaderForTest()}, &raft.TimeoutNowResponse{}); err != nil {
		t.Fatalf("starting B's election: %v", err)
	}
	if l := waitLeaderAmong(c, b, cc); l != b {
		t.Fatalf("peer %d won the election, want B (%d)", l, b)
	}
	if got := B.RaftForTest().CurrentTerm(); got != term+1 {
		t.Fatalf("B leads term %d, want %d", got, term+1)
	}
	last := putVia(t, c, b, "/after", "v")
	c.Net.Heal()
	waitApplied(c, uint64(last), 10*time.Second)

	checkAbsent(t, c, "/x", "a write no leader ever committed (hashicorp/raft#695)")
	checkLogMatching(t, c)
	c.WaitForIdenticalStores(5 * time.Second)
}

// TestLeaderReelectedAfterInterruptedTransferTakesWrites is hashicorp/raft#696. LeadershipTransfer hands the
// transfer's target a catch-up request through a one-slot channel of that follower's replication and waits
// for the answer. When replication to the target is stuck (here: dials to it hang), a transfer times out with
// its request still queued, and the next transfer in the same term blocks on sending its own. If the leader
// then loses leadership, that replication goroutine exits without reading the channel, the transfer
// goroutine stays blocked forever, and with it raft's "leadership transfer in progress" flag: when the peer
// is elected again it refuses every write (and its barrier, and any configuration change) for good.
func TestLeaderReelectedAfterInterruptedTransferTakesWrites(t *testing.T) {
	c := rt.TestCluster(t, 3)
	a := c.WaitForLeader()
	b, cc := (a+1)%3, (a+2)%3
	A := c.Node(a)

	// A's dials to B hang: replication to B stalls in a dial (the heartbeat's too).
	c.Net.Hold(addrOf(c, a), addrOf(c, b))
	putVia(t, c, a, "/k/1", "v") // commits through A and C, leaves B behind
	c.WaitFor("replication to B stuck in a dial", 5*time.Second, func() error {
		if n := c.Net.HeldDials(addrOf(c, a), addrOf(c, b)); n < 2 {
			return fmt.Errorf("%d held dials", n)
		}
		return nil
	})
	// An operator retries a transfer that timed out. Each attempt times out; one of them blocks for good on the
	// catch-up request an earlier one left queued, and raft's transfer flag stays set past any transfer's end.
	stuck := false
	for i := 0; i < 5 && !stuck; i++ {
		err := A.TransferLeadership(c.Config(b).ID)
		t.Logf("transfer %d: %v", i+1, err)
		time.Sleep(3 * c.Config(a).ElectionTimeout) // well past the transfer's own timeout
		err = A.RaftForTest().Apply(nil, 100*time.Millisecond).Error()
		stuck = errors.Is(err, raft.ErrLeadershipTransferInProgress)
	}
	if !stuck {
		t.Fatal("no transfer got stuck: the scenario did not set up")
	}

	// A loses its quorum (C cut off, B hanging) and steps down; B and C elect a leader.
	c.Net.Partition([]string{addrOf(c, a)}, []string{addrOf(c, cc)})
	waitLeaderAmong(c, b, cc)
	c.WaitFor("A to step down", 5*time.Second, func() error {
		if A.IsLeader() {
			return fmt.Errorf("A still leads")
		}
		return nil
	})
	// The hang ends: A's old replication to B completes its dial, learns of the newer term and exits.
	c.Net.Release(addrOf(c, a), addrOf(c, b))
	c.Net.Heal()

	// A is elected again.
	c.WaitFor("A to lead again", 10*time.Second, func() error {
		if A.IsLeader() {
			return nil
		}
		if l := c.Leader(); l >= 0 && l != a {
			if err := c.Node(l).TransferLeadership(A.ID()); err != nil {
				return err
			}
		}
		return fmt.Errorf("A does not lead")
	})

	// Writes through every peer must go through, within the usual bound.
	for i := 0; i < 3; i++ {
		start := time.Now()
		if _, err := c.Put(i, fmt.Sprintf("/k/after-%d", i), "v"); err != nil {
			t.Fatalf("write through peer %d after A's re-election: %v (after %v; A leader: %v)", i, err, time.Since(start), A.IsLeader())
		}
	}
	c.WaitForIdenticalStores(10 * time.Second)
}

// TestFollowerWithConflictingLogConvergesAfterSnapshotInstall is hashicorp/raft#697. A follower whose log has
// an uncommitted suffix (it led a minority for a moment) gets an InstallSnapshot whose last index falls inside
// that suffix. Raft installs it but keeps the conflicting entry at the snapshot's index, so every following
// AppendEntries fails its consistency check at that index, and the leader, which no longer has the entries
// before it, sends the snapshot again: forever. The follower stops replicating (its store stays at the
// snapshot, its reads time out) and the leader streams the whole snapshot in a loop.
//
// Two ways lead there: an operator's snapshot restore on the new leader (the restored snapshot sits at the
// leader's next index, which the stale suffix covers when it is longer than the new leader's log), and a
// leader that compacted its log past the point where the stale suffix begins (short trailing logs).
func TestFollowerWithConflictingLogConvergesAfterSnapshotInstall(t *testing.T) {
	cases := []struct {
		name string
		opt  func(*raftnode.Config)
		// diverge runs on the new leader l while the old leader (with its stale suffix of n entries starting
		// at index k) is cut off; afterwards the new leader's latest snapshot must end inside that suffix.
		// It returns the peer that leads when it is done.
		diverge func(t *testing.T, c *rt.Cluster, a, l int, k uint64) int
		// afterHeal, when set, runs once the network heals and returns the peer that leads afterwards.
		afterHeal func(t *testing.T, c *rt.Cluster, a, l int) int
	}{
		{
			name: "restore on the new leader",
			diverge: func(t *testing.T, c *rt.Cluster, a, l int, k uint64) int {
				// On a starved machine the majority's leader can lose its lease mid-restore; an operator
				// would run the restore again on whichever peer leads then, and so does the test.
				for attempt := 1; ; attempt++ {
					err := saveAndRestore(t, c.Node(l))
					if err == nil {
						return l
					}
					if attempt == 3 || !(errors.Is(err, raft.ErrLeadershipLost) || errors.Is(err, raftnode.ErrNotLeader) || errors.Is(err, raftnode.ErrUnknownOutcome)) {
						t.Fatalf("restore on peer %d (attempt %d): %v", l, attempt, err)
					}
					t.Logf("restore on peer %d lost leadership (attempt %d): %v; again on the next leader", l, attempt, err)
					l = waitLeaderAmong(c, (a+1)%3, (a+2)%3)
				}
			},
		},
		{
			name: "leader compacted past the divergence",
			opt: func(cfg *raftnode.Config) {
				cfg.TrailingLogs = 8
				cfg.SnapshotThreshold = 1 << 30 // snapshots only when the test asks
			},
			diverge: func(t *testing.T, c *rt.Cluster, a, l int, k uint64) int {
				for i := 0; c.Node(l).RaftForTest().LastIndex() < k+20; i++ {
					putVia(t, c, l, fmt.Sprintf("/new/%d", i), "v")
				}
				if err := c.Node(l).RaftForTest().Snapshot().Error(); err != nil {
					t.Fatal(err)
				}
				if first, _, _ := c.Node(l).LogBoundsForTest(); first < k {
					t.Fatalf("leader log still starts at %d, before the divergence at %d", first, k)
				}
				return l
			},
		},
		{
			// The cut-off peer installs the compacted leader's snapshot, but its request for a snapshot past
			// its log fails (the leader is being deposed), and leadership moves to the third peer, whose log
			// was never compacted (shorter than its TrailingLogs) and still starts at index 1: it never misses
			// an entry, so it sends entries instead of a snapshot unless it compacts.
			name: "leadership moves to a peer that never compacted",
			opt:  func(cfg *raftnode.Config) { cfg.SnapshotThreshold = 1 << 30 },
			diverge: func(t *testing.T, c *rt.Cluster, a, l int, k uint64) int {
				for i := 0; c.Node(l).RaftForTest().LastIndex() < k+20; i++ {
					putVia(t, c, l, fmt.Sprintf("/new/%d", i), "v")
				}
				// The cut-off peer and the new leader keep 8 trailing entries; the third peer the default.
				for _, i := range []int{a, l} {
					r := c.Node(i).RaftForTest()
					rc := r.ReloadableConfig()
					rc.TrailingLogs = 8
					if err := r.ReloadConfig(rc); err != nil {
						t.Fatal(err)
					}
				}
				if err := c.Node(l).RaftForTest().Snapshot().Error(); err != nil {
					t.Fatal(err)
				}
				c.Node(l).RefuseSnapshotPastForTest(true)
				return l
			},
			afterHeal: func(t *testing.T, c *rt.Cluster, a, l int) int {
				c.WaitFor("the cut-off peer to install a snapshot", 10*time.Second, func() error {
					if c.Node(a).Stats()["snapshot_installs"] == 0 {
						return errors.New("no snapshot installed yet")
					}
					return nil
				})
				m := 3 - a - l
				if first, _, _ := c.Node(m).LogBoundsForTest(); first != 1 {
					t.Fatalf("the third peer's log starts at %d, want 1 (never compacted)", first)
				}
				if err := c.Node(l).TransferLeadership(c.Config(m).ID); err != nil {
					t.Fatalf("transfer leadership to peer %d: %v", m, err)
				}
				return waitLeaderAmong(c, m)
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var opts []rt.Option
			if tc.opt != nil {
				opts = append(opts, tc.opt)
			}
			c := rt.TestCluster(t, 3, opts...)
			a := c.WaitForLeader()
			A := c.Node(a)
			for i := 0; i < 5; i++ {
				putVia(t, c, a, fmt.Sprintf("/k/%d", i), "v")
			}
			k := waitSameLastIndex(c) + 1 // where A's stale suffix will begin

			// A, cut off, still takes writes into its log until its lease runs out: a stale suffix.
			const stale = 40
			c.Net.Partition([]string{addrOf(c, a)}, others(c, a))
			var wg sync.WaitGroup
			for i := 0; i < stale; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					defer cancel()
					A.Apply(ctx, &fsm.Command{Type: fsm.CmdTxn, Txn: &fsm.Txn{Success: []fsm.Op{{Type: fsm.OpPut, Key: fmt.Sprintf("/stale/%d", i), Value: []byte("x")}}}})
				}()
			}
			wg.Wait()
			staleLast := A.RaftForTest().LastIndex()
			if staleLast < k+stale/2 {
				t.Fatalf("the cut-off leader's log ends at %d; want a stale suffix from %d", staleLast, k)
			}
			staleEntry, err := A.LogForTest(k)
			if err != nil {
				t.Fatal(err)
			}
			l := waitLeaderAmong(c, (a+1)%3, (a+2)%3)
			l = tc.diverge(t, c, a, l, k)
			snaps := c.Node(l).RaftForTest().Stats()["last_snapshot_index"]
			t.Logf("stale suffix %d-%d on A, new leader's latest snapshot at %s", k, staleLast, snaps)

			c.Net.Heal()
			if tc.afterHeal != nil {
				l = tc.afterHeal(t, c, a, l)
			}
			last := putVia(t, c, l, "/after", "v")
			waitApplied(c, uint64(last), 15*time.Second)
			c.WaitForIdenticalStores(10 * time.Second)
			checkLogMatching(t, c)
			for i := 0; i < stale; i++ {
				checkAbsent(t, c, fmt.Sprintf("/stale/%d", i), "an uncommitted write of the cut-off leader")
			}
			// Rule 7 discards the log that conflicts with an installed snapshot. Kept below the snapshot, the
			// uncommitted entries would go out as committed ones to a lagging follower if A led later.
			for idx := k; idx <= staleLast; idx++ {
				if l, err := A.LogForTest(idx); err == nil && l.Term == staleEntry.Term {
					t.Errorf("A still holds its uncommitted entry %d (term %d) under the snapshot it installed", idx, l.Term)
					break
				}
			}
		})
	}
}
