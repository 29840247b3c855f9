package raftnode

// Workarounds for issues of hashicorp/raft v1.7.3 (the newest release) that are open upstream, with no fix on
// its main branch yet. Each names its issue; drop it once Skiff requires a release that fixes the issue, and
// re-check each against a raft upgrade: they lean on where v1.7.3 consults its transport and log store.
// The regression tests are in upstream_test.go.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"

	"github.com/skiff-dev/skiff/fsm"
)

// rpcHeader is the header this peer puts on the Raft RPCs it sends in its own name.
func (n *Node) rpcHeader() raft.RPCHeader {
	return raft.RPCHeader{
		ProtocolVersion: raft.ProtocolVersionMax,
		ID:              []byte(n.cfg.ID),
		Addr:            n.trans.EncodePeer(raft.ServerID(n.cfg.ID), raft.ServerAddress(n.addr.String())),
	}
}

// --- hashicorp/raft#695: a heartbeat changes the term under the main loop ---

// mainLoopTransport is the Raft transport without the heartbeat fast path.
//
// NetworkTransport hands a heartbeat (an AppendEntries without entries) to a handler raft registers, which runs
// raft's appendEntries on the connection's goroutine, concurrently with raft's main loop. A heartbeat of a
// newer term thus moves the term and state of a leader while its main loop sits in its select; the next write
// the loop takes is appended and stored in the NEW term. The real leader of that term holds a different entry
// at that index, and when it replicates, the old leader keeps its own entry as a duplicate and applies a write
// that never committed (hashicorp/raft#695: Log Matching and State Machine Safety violated; the issue also
// reports Election Safety violations from the same race). Declining the handler makes the transport queue
// heartbeats to the main loop like every other RPC, so terms and states change only there, between two of its
// steps.
//
// The cost is the fast path's benefit: a follower answers a heartbeat between two of its disk writes, so a
// slow fsync delays its answer. The follower's own election timer is safe (the entry it was writing counts as
// contact), pre-vote keeps a candidate that starts anyway from disrupting the leader, and the leader keeps its
// lease as long as a quorum answers within LeaderLeaseTimeout.
type mainLoopTransport struct{ *raft.NetworkTransport }

// SetHeartbeatHandler ignores the handler: heartbeats go through raft's main loop (hashicorp/raft#695).
func (mainLoopTransport) SetHeartbeatHandler(func(raft.RPC)) {}

// The wrapper keeps the optional interfaces raft looks for: pre-vote, and closing on shutdown.
var (
	_ raft.WithPreVote = mainLoopTransport{}
	_ raft.WithClose   = mainLoopTransport{}
)

// --- hashicorp/raft#696: the transfer flag stays set ---

// stuckTransferAfter is how long raft may refuse writes as "leadership transfer in progress" before this
// peer takes the transfer for stuck (hashicorp/raft#696).
//
// A transfer asks the target's replication to catch it up through a one-slot channel and waits for the answer.
// When that replication is stuck (say, sending to a peer that does not answer), a transfer gives up after an
// election timeout with its request still queued; the next transfer in the same term then blocks on sending
// its own, and if leadership is lost, that replication goroutine exits without reading the channel. The
// transfer goroutine stays blocked for good, and raft's flag with it: when the peer leads again, it refuses
// every write, its barrier, and any configuration change, forever. Without the bug, the flag lasts an election
// timeout plus the TimeoutNow RPC's round trip, and then another election timeout at most; past a few election
// timeouts it is stuck, or waiting on a target that does not answer, and either way handing leadership to a
// responsive, up-to-date voter is what the transfer was for.
func (n *Node) stuckTransferAfter() time.Duration { return max(4*n.cfg.ElectionTimeout, time.Second) }

// noteTransferRefusal records that raft refused a write of this leader because a leadership transfer is in
// progress and, once that has lasted stuckTransferAfter, hands leadership off. The leader's barrier retries
// while it is refused, so a leader elected with the flag stuck gets here without any client write.
func (n *Node) noteTransferRefusal() {
	now := time.Now().UnixNano()
	n.transferRefusedSince.CompareAndSwap(0, now)
	since := n.transferRefusedSince.Load()
	if since == 0 || time.Duration(now-since) < n.stuckTransferAfter() || !n.handingOff.CompareAndSwap(false, true) {
		return // a write went through meanwhile, or not stuck long enough, or a hand-off is under way
	}
	go n.handOffStuckLeadership(time.Duration(now - since))
}

// handOffStuckLeadership makes the most up-to-date voter start an election by sending it the TimeoutNow RPC
// a transfer ends with: the stuck flag blocks raft's own transfer too. The target wins if its log is
// complete; it is, as a leader that refuses writes appends nothing while its replication keeps running.
// Election safety does not depend on the choice; if the election fails, the next refusal past
// stuckTransferAfter tries again.
func (n *Node) handOffStuckLeadership(refusedFor time.Duration) {
	defer n.handingOff.Store(false)
	defer n.transferRefusedSince.Store(time.Now().UnixNano()) // the next attempt waits a full period
	select {
	case <-n.shutdown:
		return
	default:
	}
	if !n.IsLeader() {
		return
	}
	target, err := n.mostUpToDateVoter()
	if err != nil {
		n.logger.Error("raft has refused writes as a leadership transfer in progress for too long (hashicorp/raft#696); no voter to hand leadership to",
			"refused_for", refusedFor, "error", err)
		return
	}
	n.logger.Error("raft has refused writes as a leadership transfer in progress for too long (hashicorp/raft#696); handing leadership off. Restart this server to clear its stuck transfer",
		"refused_for", refusedFor, "to", target.ID)
	err = n.trans.TimeoutNow(raft.ServerID(target.ID), raft.ServerAddress(target.Address),
		&raft.TimeoutNowRequest{RPCHeader: n.rpcHeader()}, &raft.TimeoutNowResponse{})
	if err != nil {
		n.logger.Warn("handing leadership off failed", "to", target.ID, "error", err)
	}
}

// mostUpToDateVoter asks every other voter for its last log index and returns the one furthest along.
func (n *Node) mostUpToDateVoter() (ServerInfo, error) {
	servers, err := n.Servers()
	if err != nil {
		return ServerInfo{}, err
	}
	var best ServerInfo
	var bestIndex uint64
	found := false
	for _, s := range servers {
		if s.ID == n.cfg.ID || !s.Voter {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := n.Status(ctx, s.Address)
		cancel()
		if err != nil {
			continue
		}
		if !found || st.LastIndex > bestIndex {
			best, bestIndex, found = s, st.LastIndex, true
		}
	}
	if !found {
		return ServerInfo{}, errors.New("no other voter answered")
	}
	return best, nil
}

// --- hashicorp/raft#697: InstallSnapshot keeps a conflicting log ---

// logStore is the Raft log store: raft-boltdb, plus Rule 7 of InstallSnapshot (Raft paper, figure 13), which
// hashicorp/raft v1.7.3 skips (hashicorp/raft#697). After installing a snapshot, a follower keeps the entries
// that follow the snapshot's last entry if its log holds that entry (same index and term), and otherwise
// discards its whole log. raft instead always keeps the log, compacted as after a local snapshot:
//   - When the log holds a different entry at the snapshot's index (an uncommitted suffix, written while this
//     peer led a minority or followed a deposed leader), every AppendEntries that follows fails its
//     consistency check at that index or below it, and the leader walks back to an entry it no longer has
//     and sends the snapshot again, or, if its log still starts at index 1, sends entries from there that
//     the follower cannot check either: a livelock. The follower stops replicating.
//   - When the log ends before the snapshot's index, the follower ignores it, but an uncommitted suffix kept in
//     it would be sent as committed entries to a lagging follower should this peer lead later.
//
// raft asks IsMonotonic right after installing a snapshot, and on the leader right after restoring a user
// snapshot, to choose between discarding the whole log ("monotonic" stores cannot hold a gap) and compacting
// it; nowhere else. logStore answers yes whenever Rule 7 discards the log: the store then holds the right
// log, durably. raft's cached last log index and term still point at the discarded suffix until a snapshot
// past it arrives (or raft restarts and reads the store), and until then AppendEntries fails as above; so
// the follower asks the leader for a snapshot past that index (requestSnapshotPast), at once and again from
// snapshotConflictLoop while the cache stays ahead of the store.
type logStore struct {
	*raftboltdb.BoltStore
	n *Node
}

// IsMonotonic reports whether raft must discard the whole log after the snapshot it just installed or
// restored, the newest of the snapshot store (see logStore).
func (s logStore) IsMonotonic() bool {
	snaps, err := s.n.snaps.List()
	if err != nil || len(snaps) == 0 {
		return false
	}
	snap := snaps[0]
	last, err := s.LastIndex()
	if err != nil {
		return false
	}
	if last < snap.Index {
		return true
	}
	var l raft.Log
	if err := s.GetLog(snap.Index, &l); err == nil && l.Term == snap.Term {
		return false // the log holds the snapshot's last entry: keep what follows
	}
	go s.n.requestSnapshotPast(snap.Index, last)
	return true
}

// snapshotConflictLoop asks the leader for a snapshot past raft's cached last log index while that index
// stays past both the log store and the newest snapshot: the state IsMonotonic leaves when it discards a log
// that conflicts with an installed snapshot. The first request may go to a leader that is deposed before it
// answers, or that compacts no log and keeps sending entries instead of the snapshot; this one retries. Two
// ticks in a row are required because raft's AppendEntries briefly leaves the store behind its cache when
// it replaces a conflicting suffix.
func (n *Node) snapshotConflictLoop() {
	defer n.bgWG.Done()
	t := time.NewTicker(n.cfg.ElectionTimeout)
	defer t.Stop()
	seen := false
	for {
		select {
		case <-n.shutdown:
			return
		case <-t.C:
		}
		snapIndex, cached, ahead := n.cacheAheadOfStore()
		if !ahead || n.raft.State() != raft.Follower {
			seen = false
			continue
		}
		if seen {
			go n.requestSnapshotPast(snapIndex, cached)
		}
		seen = true
	}
}

// cacheAheadOfStore reports whether raft's cached last log index is past the end of the log store and the
// newest snapshot, with the newest snapshot's index and the cached index.
func (n *Node) cacheAheadOfStore() (snapIndex, cached uint64, ahead bool) {
	cached = n.raft.LastIndex()
	last, err := n.logs.LastIndex()
	if err != nil {
		return 0, 0, false
	}
	if snaps, err := n.snaps.List(); err == nil && len(snaps) > 0 {
		snapIndex = snaps[0].Index
	}
	return snapIndex, cached, cached > max(last, snapIndex)
}

// requestSnapshotPast asks the leader for a snapshot whose last index is past index, the end of our log, after
// installing one that ends at snapIndex (one request at a time).
func (n *Node) requestSnapshotPast(snapIndex, index uint64) {
	if !n.askingSnapshot.CompareAndSwap(false, true) {
		return
	}
	defer n.askingSnapshot.Store(false)
	select {
	case <-n.shutdown:
		return
	default:
	}
	// The leader sends the snapshot again until it has a newer one: warn once per snapshot.
	if n.conflictWarned.Swap(snapIndex) != snapIndex {
		n.logger.Warn("the log conflicts with the snapshot just installed (hashicorp/raft#697); asking the leader for a snapshot past the log",
			"snapshot_index", snapIndex, "last_log_index", index)
	}
	_, leaderAddr := n.Leader()
	if leaderAddr == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), n.cfg.ApplyTimeout)
	defer cancel()
	var reply SnapshotPastReply
	if err := n.pool.call(ctx, leaderAddr, "Skiff.SnapshotPast", SnapshotPastArgs{Index: index}, &reply); err != nil {
		n.logger.Warn("asking the leader for a snapshot past our log failed", "index", index, "error", err)
		return
	}
	n.logger.Info("the leader took a snapshot past our log", "log_index", index, "snapshot_index", reply.Index)
}

// maxSnapshotPad bounds the no-ops snapshotPast appends: a follower's uncommitted suffix is what deposed leaders
// appended without committing, far less than this.
const maxSnapshotPad = 1 << 16

// snapshotPast makes sure the newest snapshot of this leader ends past index, and returns its last index. If
// the log has not reached index yet (the follower's uncommitted suffix is longer than this leader's log), it
// appends no-ops first.
func (n *Node) snapshotPast(ctx context.Context, index uint64) (uint64, error) {
	n.snapshotPastMu.Lock()
	defer n.snapshotPastMu.Unlock()
	newest := func() uint64 {
		if snaps, err := n.snaps.List(); err == nil && len(snaps) > 0 {
			return snaps[0].Index
		}
		return 0
	}
	if !n.IsLeader() {
		return 0, ErrNotLeader
	}
	if s := newest(); s > index {
		return s, n.compactFromStart(ctx)
	}
	if applied := n.store.AppliedIndex(); index >= applied+maxSnapshotPad {
		return 0, fmt.Errorf("raftnode: index %d is too far past the applied index %d", index, applied)
	}
	for n.store.AppliedIndex() <= index {
		if _, err := n.Apply(ctx, &fsm.Command{Type: fsm.CmdNoop}); err != nil {
			return 0, err
		}
	}
	if err := n.raft.Snapshot().Error(); err != nil && newest() <= index {
		return 0, err
	}
	return newest(), n.compactFromStart(ctx)
}

// compactFromStart makes sure this leader's log no longer starts at index 1. A follower that rejects every
// AppendEntries walks the leader back through its log, and gets the snapshot only once the leader misses an
// entry; from a log that starts at index 1 (shorter than TrailingLogs, never compacted) the leader sends
// entries from 1 instead, forever. Compaction here keeps no trailing entries, so a lagging follower gets a
// snapshot too: a rare repair, not the steady state.
func (n *Node) compactFromStart(ctx context.Context) error {
	if first, err := n.logs.FirstIndex(); err != nil || first != 1 {
		return err
	}
	rc := n.raft.ReloadableConfig()
	trailing := rc.TrailingLogs
	rc.TrailingLogs = 0
	if err := n.raft.ReloadConfig(rc); err != nil {
		return err
	}
	defer func() {
		rc.TrailingLogs = trailing
		if err := n.raft.ReloadConfig(rc); err != nil {
			n.logger.Error("restoring raft's trailing logs failed", "trailing_logs", trailing, "error", err)
		}
	}()
	// A snapshot needs an entry past the last one; that snapshot's compaction then starts the log after it.
	if _, err := n.Apply(ctx, &fsm.Command{Type: fsm.CmdNoop}); err != nil {
		return err
	}
	return n.raft.Snapshot().Error()
}
