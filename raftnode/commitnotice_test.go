package raftnode_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/fsm"
	"github.com/skiff-dev/skiff/raftnode"
	rt "github.com/skiff-dev/skiff/raftnode/raftnodetest"
)

// A write that nothing follows reaches every follower's store without waiting for CommitTimeout: the leader
// tells them of the commit (commitnotice.go). With CommitTimeout at 3 s, followers that waited for it would
// learn each commit 3 to 6 s late; the bound below is half the shortest of those.
func TestFollowersLearnALastWriteAtOnce(t *testing.T) {
	c := rt.TestCluster(t, 3, func(cfg *raftnode.Config) { cfg.CommitTimeout = 3 * time.Second })
	leader := c.WaitForLeader()
	writer := (leader + 1) % 3 // a follower, which forwards the write
	for round := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		res, err := c.Node(writer).Apply(ctx, &fsm.Command{Type: fsm.CmdCreate, Key: fmt.Sprintf("/k/%d", round), Value: []byte("v")})
		cancel()
		if err != nil || res.Code != fsm.CodeOK {
			t.Fatalf("write %d: %v %v", round, res.Code, err)
		}
		for i := range 3 {
			stop := make(chan struct{})
			timer := time.AfterFunc(1500*time.Millisecond, func() { close(stop) })
			applied := c.Node(i).Store().WaitApplied(uint64(res.Revision), stop)
			timer.Stop()
			if !applied {
				var states []string
				for j := range 3 {
					_, last, _ := c.Node(j).LogBoundsForTest()
					states = append(states, fmt.Sprintf("%s %s applied %d last %d", c.Node(j).ID(), c.Node(j).State(), c.Node(j).Store().AppliedIndex(), last))
					if c.Node(j).IsLeader() {
						for k := uint64(1); k <= last; k++ {
							l, _ := c.Node(j).LogForTest(k)
							states = append(states, fmt.Sprintf("[%d %v %d bytes term %d]", k, l.Type, len(l.Data), l.Term))
						}
					}
				}
				t.Fatalf("write %d (index %d) through %s not in peer %d's store 1.5 s after it was acknowledged: %v", round, res.Revision, c.Node(writer).ID(), i, states)
			}
		}
	}
}
