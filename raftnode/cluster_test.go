package raftnode_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/fsm"
	"github.com/skiff-dev/skiff/raftnode"
	rt "github.com/skiff-dev/skiff/raftnode/raftnodetest"
)

func get(t *testing.T, n *raftnode.Node, key string) string {
	t.Helper()
	kv, _, err := n.Store().Get(key)
	if err != nil {
		return ""
	}
	return string(kv.Value)
}

func TestKillLeaderElectsNewOneAndWritesContinue(t *testing.T) {
	c := rt.TestCluster(t, 3)
	// Under -race with other packages on two cores the 50 ms lease can lapse right after the election: the
	// write is retried, and the peer killed is whoever leads once it committed.
	c.MustPut(c.WaitForLeader(), "/k/before", "1")
	old := c.WaitForLeader()
	c.Stop(old)
	survivor := (old + 1) % 3
	c.WaitFor("a new leader", 10*time.Second, func() error {
		if l := c.Leader(); l < 0 || l == old {
			return fmt.Errorf("leader %d", l)
		}
		return nil
	})
	// Writes through a follower are forwarded to the new leader.
	for i := 0; i < 3; i++ {
		peer := survivor
		if i%2 == 1 {
			peer = (old + 2) % 3
		}
		c.MustPut(peer, fmt.Sprintf("/k/after-%d", i), "2")
	}
}

func TestPartitionedMinorityCannotCommit(t *testing.T) {
	c := rt.TestCluster(t, 3)
	leader := c.WaitForLeader()
	minority := []string{c.Config(leader).BindAddr}
	var majority []string
	for i := 0; i < 3; i++ {
		if i != leader {
			majority = append(majority, c.Config(i).BindAddr)
		}
	}
	c.Net.Partition(minority, majority)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := c.Node(leader).Apply(ctx, &fsm.Command{Type: fsm.CmdCreate, Key: "/minority", Value: []byte("x")})
	if err == nil {
		t.Fatal("the partitioned old leader committed a write")
	}
	// The majority elects a leader and commits.
	other := (leader + 1) % 3
	c.MustPut(other, "/majority", "y") // while the majority elects, through whoever leads it
	c.Net.Heal()
	c.WaitFor("old leader to converge", 10*time.Second, func() error {
		if got := get(t, c.Node(leader), "/majority"); got != "y" {
			return fmt.Errorf("old leader has /majority=%q", got)
		}
		return nil
	})
	// The minority's write either never committed or was overwritten: it must not appear anywhere.
	for i := 0; i < 3; i++ {
		if _, _, err := c.Node(i).Store().Get("/minority"); !errors.Is(err, fsm.ErrNotFound) {
			t.Fatalf("peer %d holds the minority write", i)
		}
	}
}

func TestRestartedPeerCatchesUp(t *testing.T) {
	c := rt.TestCluster(t, 3)
	leader := c.WaitForLeader()
	follower := (leader + 1) % 3
	c.Stop(follower)
	for i := 0; i < 50; i++ {
		c.MustPut(leader, fmt.Sprintf("/k/%d", i), "v")
	}
	c.Start(follower)
	c.WaitFor("restarted follower to catch up", 10*time.Second, func() error {
		if n, _ := c.Node(follower).Store().Count("/k/"); n != 50 {
			return fmt.Errorf("follower has %d keys", n)
		}
		return nil
	})
}

func TestLaggingFollowerRestoredBySnapshotInstall(t *testing.T) {
	c := rt.TestCluster(t, 3, func(cfg *raftnode.Config) {
		cfg.SnapshotThreshold = 64
		cfg.SnapshotInterval = 50 * time.Millisecond
		cfg.TrailingLogs = 16
	})
	leader := c.WaitForLeader()
	lagging := (leader + 1) % 3
	c.Stop(lagging)
	for i := 0; i < 400; i++ {
		c.MustPut(leader, fmt.Sprintf("/k/%03d", i), "v")
	}
	// Wait until both running peers compacted their logs past what the lagging follower has: whichever
	// leads when it returns (leadership may have moved during the writes) must send a snapshot.
	c.WaitFor("snapshot and compaction", 10*time.Second, func() error {
		for i := 0; i < 3; i++ {
			if i == lagging {
				continue
			}
			if first := c.Node(i).Stats()["first_log_index"]; first <= 100 {
				return fmt.Errorf("peer %d log still starts at %d", i, first)
			}
		}
		return nil
	})
	c.Start(lagging)
	c.WaitFor("snapshot install", 15*time.Second, func() error {
		if n, _ := c.Node(lagging).Store().Count("/k/"); n != 400 {
			return fmt.Errorf("lagging follower has %d keys", n)
		}
		return nil
	})
	if c.Node(lagging).Stats()["snapshot_installs"] == 0 {
		t.Fatal("follower caught up without installing a snapshot")
	}
	// Stores converge byte for byte once every peer applied the same index.
	c.MustPut(leader, "/final", "x")
	c.WaitForIdenticalStores(20 * time.Second)
}

func TestAllPeersRestartedKeepEveryAcknowledgedWrite(t *testing.T) {
	c := rt.TestCluster(t, 3)
	var mu sync.Mutex
	acked := map[string]bool{}
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 40; i++ {
				key := fmt.Sprintf("/k/%d-%d", w, i)
				if _, err := c.Put(w%3, key, "v"); err == nil {
					mu.Lock()
					acked[key] = true
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if len(acked) == 0 {
		t.Fatal("no write was acknowledged")
	}
	c.StopAll()
	for i := 0; i < 3; i++ {
		c.Start(i)
	}
	c.WaitForLeader()
	for i := 0; i < 3; i++ {
		n := c.Node(i)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := n.LinearizableRead(ctx); err != nil {
			t.Fatalf("read on peer %d: %v", i, err)
		}
		cancel()
		for key := range acked {
			if _, _, err := n.Store().Get(key); err != nil {
				t.Fatalf("peer %d lost acknowledged write %s", i, key)
			}
		}
	}
}

func TestLinearizableReadOnFollower(t *testing.T) {
	c := rt.TestCluster(t, 3)
	leader := c.WaitForLeader()
	follower := (leader + 1) % 3
	for i := 0; i < 100; i++ {
		key := fmt.Sprintf("/k/%d", i)
		c.MustPut(leader, key, fmt.Sprint(i)) // acknowledged, through whoever leads now
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := c.Node(follower).LinearizableRead(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if got := get(t, c.Node(follower), key); got != fmt.Sprint(i) {
			t.Fatalf("follower read %s=%q right after the leader acknowledged %d", key, got, i)
		}
	}
}

func TestNoLeaderWriteFailsAfterBoundedWait(t *testing.T) {
	c := rt.TestCluster(t, 3, func(cfg *raftnode.Config) { cfg.ApplyTimeout = 500 * time.Millisecond })
	leader := c.WaitForLeader()
	c.Stop((leader + 1) % 3)
	c.Stop((leader + 2) % 3)
	lone := c.Node(leader)
	c.WaitFor("leader to step down", 5*time.Second, func() error {
		if lone.IsLeader() {
			return fmt.Errorf("still leader")
		}
		return nil
	})
	start := time.Now()
	_, err := lone.Apply(context.Background(), &fsm.Command{Type: fsm.CmdCreate, Key: "/x"})
	if !errors.Is(err, raftnode.ErrNoLeader) {
		t.Fatalf("err = %v, want ErrNoLeader", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatalf("write waited %v, beyond its bound", time.Since(start))
	}
}

func TestTTLKeysExpireThroughLeader(t *testing.T) {
	c := rt.TestCluster(t, 3)
	leader := c.WaitForLeader()
	ctx := context.Background()
	soon := time.Now().Add(200 * time.Millisecond).UnixNano()
	for _, key := range []string{"/events/a", "/events/b"} {
		if _, err := c.Node(leader).Apply(ctx, &fsm.Command{Type: fsm.CmdCreate, Key: key, ExpiresAt: soon}); err != nil {
			t.Fatal(err)
		}
	}
	// A refresh before expiry moves the deadline: /events/b must outlive the first deadline.
	later := time.Now().Add(time.Hour).UnixNano()
	if _, err := c.Node(leader).Apply(ctx, &fsm.Command{Type: fsm.CmdUpdate, Key: "/events/b", ExpiresAt: later}); err != nil {
		t.Fatal(err)
	}
	c.WaitFor("expiry on every peer", 10*time.Second, func() error {
		for i := 0; i < 3; i++ {
			if _, _, err := c.Node(i).Store().Get("/events/a"); err == nil {
				return fmt.Errorf("peer %d still has /events/a", i)
			}
		}
		return nil
	})
	if _, _, err := c.Node(leader).Store().Get("/events/b"); err != nil {
		t.Fatal("refreshed key expired")
	}
}

func TestMembershipChanges(t *testing.T) {
	c := rt.TestCluster(t, 3)
	leader := c.WaitForLeader()
	target := (leader + 1) % 3
	if err := c.Node(leader).TransferLeadership(c.Config(target).ID); err != nil {
		t.Fatal(err)
	}
	c.WaitFor("leadership on target", 5*time.Second, func() error {
		if c.Leader() != target {
			return fmt.Errorf("leader is %d", c.Leader())
		}
		return nil
	})
	victim := (target + 1) % 3
	if err := c.Node(target).RemoveServer(c.Config(victim).ID); err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.Node(victim).Removed():
	case <-time.After(10 * time.Second):
		t.Fatal("removed server did not notice its removal")
	}
	servers, _ := c.Node(target).Servers()
	if len(servers) != 2 {
		t.Fatalf("servers after removal = %+v", servers)
	}
}

// TestConcurrentReadsShareLeadershipChecks: reads arriving together on the leader share leadership checks
// (each check begins after the reads it answers arrived), and a leader cut off from the others serves none.
func TestConcurrentReadsShareLeadershipChecks(t *testing.T) {
	c := rt.TestCluster(t, 3)
	leader := c.WaitForLeader()
	n := c.Node(leader)
	before := n.LeadershipChecks()
	const reads = 200
	var wg sync.WaitGroup
	errs := make(chan error, reads)
	for i := 0; i < reads; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			errs <- n.LinearizableRead(ctx)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	checks := n.LeadershipChecks() - before
	if checks < 1 || checks >= reads {
		t.Fatalf("%d reads started %d leadership checks; want at least one, and fewer than the reads", reads, checks)
	}
	t.Logf("%d concurrent reads, %d leadership checks", reads, checks)

	// Partitioned, the old leader must not confirm itself to any read.
	var others []string
	for i := 0; i < 3; i++ {
		if i != leader {
			others = append(others, c.Config(i).BindAddr)
		}
	}
	c.Net.Partition([]string{c.Config(leader).BindAddr}, others)
	// A heartbeat answer the leader read just before the cut can still vote for a check that begins now:
	// hashicorp/raft's VerifyLeader counts the votes of the heartbeats in flight when it is asked, and one
	// answered before the cut is a true answer from a follower of this term. What the cut must guarantee is
	// that no heartbeat sent after it confirms the old leader, so the reads come once the rounds in flight
	// have ended (heartbeats go every 20-40 ms here; the 100 ms lease keeps the leader leading until then).
	// Without this wait the test failed once in CI: one read served.
	time.Sleep(20 * time.Millisecond)
	var served sync.WaitGroup
	var stale atomic.Int64
	for i := 0; i < 50; i++ {
		served.Add(1)
		go func() {
			defer served.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			if n.LinearizableRead(ctx) == nil {
				stale.Add(1)
			}
		}()
	}
	served.Wait()
	if stale.Load() > 0 {
		t.Fatalf("the partitioned leader served %d linearizable reads", stale.Load())
	}
	c.Net.Heal()
}

// A peer that leads again while the services of its previous term are still stopping serves linearizable
// reads at once: a service slow to stop (a controller finishing a call) must not hold up the new term. In a
// conformance run with the leader killed, reads through every server failed for two minutes with "no leader"
// after a leader lost its quorum for 0.8 s and was elected again.
func TestReadsServedWhileEarlierTermsServicesStop(t *testing.T) {
	c := rt.TestCluster(t, 3)
	const stopDelay = 8 * time.Second
	var running, started [3]atomic.Int32 // generations of the service running on each peer, and started
	for i := 0; i < 3; i++ {
		c.Node(i).OnLeadership("slow-to-stop", func(ctx context.Context) {
			started[i].Add(1)
			if n := running[i].Add(1); n > 1 {
				t.Errorf("peer-%d runs %d generations of a leader service at once", i, n)
			}
			defer running[i].Add(-1)
			<-ctx.Done()
			time.Sleep(stopDelay)
		})
	}
	// The services run from the next term on: move the leadership to a peer, away, and back to it.
	first := c.WaitForLeader()
	target := (first + 1) % 3
	transfer := func(to int) {
		t.Helper()
		c.WaitFor(fmt.Sprintf("leadership handed to peer-%d", to), 10*time.Second, func() error {
			from := c.Leader()
			if from == to {
				return nil
			}
			if from < 0 {
				return fmt.Errorf("no leader")
			}
			if err := c.Node(from).TransferLeadership(c.Config(to).ID); err != nil {
				return err
			}
			if c.Leader() != to {
				return fmt.Errorf("peer-%d leads", c.Leader())
			}
			return nil
		})
	}
	transfer(target)
	c.WaitFor("the new term's service running", 5*time.Second, func() error {
		if running[target].Load() == 0 {
			return fmt.Errorf("not running")
		}
		return nil
	})
	transfer((target + 1) % 3)
	transfer(target) // its first term's service is still stopping: stopDelay is far longer than this
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	start := time.Now()
	if err := c.Node(target).LinearizableRead(ctx); err != nil {
		t.Fatalf("read on the re-elected leader after %v: %v", time.Since(start).Round(time.Millisecond), err)
	}
	if err := c.Node((target + 1) % 3).LinearizableRead(ctx); err != nil {
		t.Fatalf("read through a follower: %v", err)
	}
	// Away and back once more while the first term's service is still stopping: the term in between ends
	// while it waits, having started nothing, and the next must still wait for the first (running[] counts).
	transfer((target + 2) % 3)
	transfer(target)
	// The new term's service starts once the old one has returned.
	c.WaitFor("the service of the new term", 2*stopDelay, func() error {
		if started[target].Load() != 2 || running[target].Load() != 1 || !c.Node(target).IsLeader() {
			return fmt.Errorf("%d generations started, %d running", started[target].Load(), running[target].Load())
		}
		return nil
	})
}
