package raftnode

import (
	"context"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/skiff-dev/skiff/fsm"
)

// Test-only access to the hashicorp/raft instance behind a Node, for the regression tests of upstream raft
// issues (upstream_test.go), which need to play a single RPC or read the raw Raft log.

// RaftForTest returns the peer's raft instance.
func (n *Node) RaftForTest() *raft.Raft { return n.raft }

// RPCHeaderForTest is the header this peer puts on the Raft RPCs it sends.
func (n *Node) RPCHeaderForTest() raft.RPCHeader { return n.rpcHeader() }

// TransportForTest returns the peer's Raft transport, to send one RPC in its name.
func (n *Node) TransportForTest() *raft.NetworkTransport { return n.trans }

// LogForTest reads one entry of the peer's Raft log store.
func (n *Node) LogForTest(index uint64) (*raft.Log, error) {
	var l raft.Log
	if err := n.logs.GetLog(index, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// LogBoundsForTest returns the first and last index of the peer's Raft log store (0, 0 when empty).
func (n *Node) LogBoundsForTest() (first, last uint64, err error) {
	if first, err = n.logs.FirstIndex(); err != nil {
		return 0, 0, err
	}
	last, err = n.logs.LastIndex()
	return first, last, err
}

// RefuseSnapshotPastForTest makes the peer answer the SnapshotPast RPC with ErrNotLeader, as a leader deposed
// before it could answer does.
func (n *Node) RefuseSnapshotPastForTest(refuse bool) { n.refuseSnapshotPast.Store(refuse) }

// LostWritesForTest returns how many writes in flight at a loss of leadership ended with this outcome.
func (n *Node) LostWritesForTest(outcome string) float64 {
	return testutil.ToFloat64(n.metrics.lostWrites.WithLabelValues(outcome))
}

// BeforeDeliverForTest runs f in the FSM loop between each batch's apply and the hand-out of its outcomes to
// the writes learning theirs after a loss of leadership: the window a loaded machine widens.
func (n *Node) BeforeDeliverForTest(f func()) { n.outcomes.beforeDeliver.Store(&f) }

// ProposeForTest proposes a command straight to hashicorp/raft on a leader no one else writes to, without
// waiting: the entry's index (the log's next), its bytes, and its future.
func (n *Node) ProposeForTest(cmd *fsm.Command) (uint64, []byte, raft.ApplyFuture) {
	data := cmd.Encode()
	index := n.raft.LastIndex() + 1
	return index, data, n.raft.Apply(data, 0)
}

// LearnOutcomeForTest runs what a former leader runs for a write in flight at the loss of its leadership.
func (n *Node) LearnOutcomeForTest(ctx context.Context, index uint64, data []byte) (fsm.Result, error) {
	return n.learnOutcome(ctx, index, data, raft.ErrLeadershipLost)
}
