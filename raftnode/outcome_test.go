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
	rt "github.com/skiff-dev/skiff/raftnode/raftnodetest"
)

// TestWritesInFlightWhenLeadershipIsLost: writers create keys through the leader while it is cut off from
// both followers. The writes in flight at the cut end with ErrLeadershipLost inside hashicorp/raft; each must
// still be answered with its true outcome, once: a created key that is acknowledged, or one proposed again.
// A write applied twice answers AlreadyExists; one wrongly taken for committed is acknowledged but missing.
func TestWritesInFlightWhenLeadershipIsLost(t *testing.T) {
	c := rt.TestCluster(t, 3)
	leader := c.WaitForLeader()
	n := c.Node(leader)
	var others []string
	for i := 0; i < 3; i++ {
		if i != leader {
			others = append(others, c.Config(i).BindAddr)
		}
	}

	type answer struct {
		key string
		err error
	}
	var (
		mu      sync.Mutex
		answers []answer
		wg      sync.WaitGroup
	)
	stop := make(chan struct{})
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("/lost/w%d-%d", w, i)
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				res, err := n.Apply(ctx, &fsm.Command{Type: fsm.CmdCreate, Key: key, Value: []byte("x")})
				cancel()
				if err == nil {
					err = res.Err()
				}
				mu.Lock()
				answers = append(answers, answer{key, err})
				mu.Unlock()
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	c.Net.Partition([]string{c.Config(leader).BindAddr}, others)
	c.WaitFor("a leader among the others", 10*time.Second, func() error {
		if l := c.Leader(); l < 0 || l == leader {
			return fmt.Errorf("leader %d", l)
		}
		return nil
	})
	time.Sleep(300 * time.Millisecond)
	c.Net.Heal()
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	c.WaitForIdenticalStores(20 * time.Second)

	acked := 0
	for _, a := range answers {
		switch {
		case a.err == nil:
			acked++
			if _, _, err := c.Node(leader).Store().Get(a.key); err != nil {
				t.Errorf("%s was acknowledged but is not in the store: %v", a.key, err)
			}
		case errors.Is(a.err, fsm.ErrAlreadyExists):
			t.Errorf("%s was applied twice: %v", a.key, a.err)
		default:
			t.Errorf("%s: %v", a.key, a.err)
		}
	}
	committed, notCommitted, unknown := n.LostWritesForTest("committed"), n.LostWritesForTest("not_committed"), n.LostWritesForTest("unknown")
	t.Logf("%d writes acknowledged; in flight at the cut: %v committed, %v not committed, %v unknown", acked, committed, notCommitted, unknown)
	if committed+notCommitted+unknown == 0 {
		t.Fatal("no write was in flight when leadership was lost: the test checked nothing")
	}
	if unknown != 0 {
		t.Errorf("%v writes ended with an unknown outcome", unknown)
	}
}

// TestLostWriteWaitsForItsOutcome: a former leader learning a write's outcome must not decide before the
// FSM loop has handed out the outcome of the batch that applied the write's index. The store makes the index
// visible as applied first; a look in between took the committed write for one never committed, and it was
// proposed (and applied) again, which a CI run on a loaded machine found as AlreadyExists. The FSM loop is
// held after a first write, a second is proposed behind it, and its outcome is learned while the loop is
// slow to hand it out.
func TestLostWriteWaitsForItsOutcome(t *testing.T) {
	c := rt.TestCluster(t, 1)
	n := c.Node(c.WaitForLeader())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	release := make(chan struct{})
	var batches atomic.Int32
	n.BeforeDeliverForTest(func() {
		switch batches.Add(1) {
		case 1:
			<-release // the first write's batch, applied: the loop waits here, the second write behind it
		case 2:
			time.Sleep(300 * time.Millisecond) // the second write's, applied: its outcome handed out late
		}
	})
	first := make(chan error, 1)
	go func() {
		_, err := n.Apply(ctx, &fsm.Command{Type: fsm.CmdCreate, Key: "/first", Value: []byte("x")})
		first <- err
	}()
	c.WaitFor("the first write's batch in the hand-out", 10*time.Second, func() error {
		if batches.Load() == 0 {
			return errors.New("not yet")
		}
		return nil
	})
	index, data, future := n.ProposeForTest(&fsm.Command{Type: fsm.CmdCreate, Key: "/second", Value: []byte("y")})
	c.WaitFor("the second write committed", 10*time.Second, func() error {
		if got := n.RaftForTest().CommitIndex(); got < index {
			return fmt.Errorf("commit index %d", got)
		}
		return nil
	})
	type answer struct {
		res fsm.Result
		err error
	}
	learned := make(chan answer, 1)
	go func() {
		res, err := n.LearnOutcomeForTest(ctx, index, data)
		learned <- answer{res, err}
	}()
	time.Sleep(200 * time.Millisecond) // it waits for the store to reach the index
	close(release)
	a := <-learned
	if a.err != nil {
		t.Fatalf("a committed write's outcome: %v", a.err)
	}
	if err := a.res.Err(); err != nil {
		t.Fatalf("a committed write's result: %v", err)
	}
	if err := future.Error(); err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
}
