package raftnode

import (
	"context"
	"time"
)

// Followers learn that an entry committed from the leader's next AppendEntries, which hashicorp/raft sends
// when an entry is appended or after CommitTimeout (1-2x, randomized) without one. The write that ends a burst
// therefore reached the followers' stores, and with them their watch caches, informers and admission, 50 to
// 100 ms after the leader acknowledged it: a pod created through a follower just after its namespace got
// `pod-security.kubernetes.io/enforce` was admitted against the old labels (issue 29; BenchmarkCacheLag).
// etcd's raft broadcasts the commit index as soon as it advances. hashicorp/raft offers no such call, so the
// leader appends an entry instead: when nothing was appended to its log in the moment after it acknowledged
// a write (an entry appended later would go out with the commit index), it proposes an empty entry, whose
// AppendEntries carries the commit index at once. One at a time, awaited before the next. The wait keeps a
// writer that writes again at once from paying for an entry per write: proposed at once, they cost a lone
// writer 43% of its writes per second (BenchmarkWrite at concurrency 1). An entry with no command moves the
// stores' applied index and nothing else (fsm.Store.ApplyBatch): not CmdNoop, which moves the revision,
// where etcd's moves only on writes (k8s.io/apiserver's storage tests check a list's resourceVersion against
// the last write's), and not raft's Barrier, which never reaches the store, so a read index that pointed at
// one would wait for the next write.
//
// Revisions are Raft indexes, so the empty entries leave gaps between the revisions of writes (as
// configuration changes always did); Kubernetes' clients take a resourceVersion as opaque. A single server has
// no follower to tell, and its revisions stay consecutive, as etcd's (k8s.io/apiserver's storage tests, which
// run on one, expect that).
//
// A shorter CommitTimeout would do the same for every idle moment: at 5 ms it brought the followers' lag to
// 10 ms at p99 but doubled an idle three-server cluster's CPU (7.4% to 15.8% of a CPU).

// commitNoticeDelay is how long the leader waits for a later entry before it proposes an empty one.
const commitNoticeDelay = 2 * time.Millisecond

// noteCommitted tells the leader's commit notice that a write was acknowledged.
func (n *Node) noteCommitted() {
	// The log's end now: an entry appended later goes out in an AppendEntries made after this commit, which
	// carries it. One appended before (in the same batch as the write, say) may have gone out before it.
	last := n.raft.LastIndex()
	for {
		cur := n.lastIndexAtAck.Load()
		if last <= cur || n.lastIndexAtAck.CompareAndSwap(cur, last) {
			break
		}
	}
	select {
	case n.commitNotice <- struct{}{}:
	default: // a notice is pending already: it covers this write too
	}
}

// announceCommits runs while this peer leads: for each notice, unless an entry was appended after the last
// acknowledgement, one empty entry, awaited before the next.
func (n *Node) announceCommits(ctx context.Context) {
	timer := time.NewTimer(0)
	<-timer.C
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.commitNotice:
		}
		timer.Reset(commitNoticeDelay)
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		if n.raft.LastIndex() > n.lastIndexAtAck.Load() {
			continue // that entry's AppendEntries carries the commit; its own acknowledgement notes it again
		}
		if n.alone() {
			continue // no follower to tell
		}
		// Its outcome does not matter: leadership lost or a transfer under way end it, and the next leader
		// proposes a no-op of its own at the start of its term.
		_ = n.raft.Apply(nil, n.cfg.ApplyTimeout).Error()
	}
}

// alone tells whether this peer is the only server of the configuration.
func (n *Node) alone() bool {
	f := n.raft.GetConfiguration()
	return f.Error() == nil && len(f.Configuration().Servers) <= 1
}
