package raftnode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"time"

	"github.com/hashicorp/raft"

	"github.com/skiff-dev/skiff/fsm"
)

// ServerInfo is one server of the Raft configuration, as seen from this peer.
type ServerInfo struct {
	ID      string
	Address string
	Voter   bool
	Leader  bool
}

// Servers returns the latest configuration this peer knows, sorted by ID, with the leader marked.
func (n *Node) Servers() ([]ServerInfo, error) {
	f := n.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, err
	}
	leaderID, _ := n.Leader()
	var out []ServerInfo
	for _, s := range f.Configuration().Servers {
		out = append(out, ServerInfo{
			ID: string(s.ID), Address: string(s.Address), Voter: s.Suffrage == raft.Voter, Leader: string(s.ID) == leaderID,
		})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// AddVoter adds a server as a voter, or updates its address. It must run on the leader; adding a server
// that is already a voter at that address is a no-op.
func (n *Node) AddVoter(id, addr string) error {
	servers, err := n.Servers()
	if err != nil {
		return err
	}
	for _, s := range servers {
		if s.ID == id && s.Address == addr && s.Voter {
			return nil
		}
	}
	return mapLeaderErr(n.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(addr), 0, n.cfg.ApplyTimeout).Error())
}

// AddNonvoter adds a server that receives the log but does not vote, or updates its address; a voter stays
// one. It must run on the leader.
func (n *Node) AddNonvoter(id, addr string) error {
	servers, err := n.Servers()
	if err != nil {
		return err
	}
	for _, s := range servers {
		if s.ID == id && s.Address == addr {
			return nil
		}
	}
	return mapLeaderErr(n.raft.AddNonvoter(raft.ServerID(id), raft.ServerAddress(addr), 0, n.cfg.ApplyTimeout).Error())
}

// RemoveServer removes a server from the configuration. It must run on the leader.
func (n *Node) RemoveServer(id string) error {
	servers, err := n.Servers()
	if err != nil {
		return err
	}
	found := false
	for _, s := range servers {
		found = found || s.ID == id
	}
	if !found {
		return fmt.Errorf("no server %q in the raft configuration", id)
	}
	if err := mapLeaderErr(n.raft.RemoveServer(raft.ServerID(id), 0, n.cfg.ApplyTimeout).Error()); err != nil {
		return err
	}
	// Tell the removed server directly, in case the configuration never reached it.
	for _, s := range servers {
		if s.ID == id && id != n.cfg.ID {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			var reply StatusReply
			n.pool.call(ctx, s.Address, "Skiff.Status", StatusArgs{}, &reply)
			cancel()
		}
	}
	return nil
}

// TransferLeadership hands leadership to the named server, or to the most up-to-date voter when id is empty.
// It must run on the leader.
func (n *Node) TransferLeadership(id string) error {
	if id == "" {
		return mapLeaderErr(n.raft.LeadershipTransfer().Error())
	}
	servers, err := n.Servers()
	if err != nil {
		return err
	}
	for _, s := range servers {
		if s.ID == id {
			if s.Leader {
				return nil
			}
			return mapLeaderErr(n.raft.LeadershipTransferToServer(raft.ServerID(s.ID), raft.ServerAddress(s.Address)).Error())
		}
	}
	return fmt.Errorf("no server %q in the raft configuration", id)
}

func mapLeaderErr(err error) error {
	if errors.Is(err, raft.ErrNotLeader) {
		return ErrNotLeader
	}
	return err
}

func (n *Node) status() StatusReply {
	leader, _ := n.Leader()
	r := StatusReply{ID: n.cfg.ID, LeaderID: leader, HasState: n.HasState(), LastIndex: n.raft.LastIndex(), AppliedIndex: n.store.AppliedIndex()}
	if !n.IsLeader() {
		r.SinceLeaderContact = -1
		if last := n.raft.LastContact(); !last.IsZero() {
			r.SinceLeaderContact = time.Since(last)
		}
	}
	if servers, err := n.Servers(); err == nil {
		for _, s := range servers {
			r.Servers = append(r.Servers, s.ID)
		}
	}
	return r
}

// Status asks the peer at a Raft address for its view of the cluster. Bootstrap uses it to make sure no
// discovered server already belongs to a cluster.
func (n *Node) Status(ctx context.Context, addr string) (StatusReply, error) {
	var reply StatusReply
	err := n.pool.call(ctx, addr, "Skiff.Status", StatusArgs{}, &reply)
	return reply, err
}

// membershipLoop notices when this peer was removed from the configuration. Raft's ShutdownOnRemove handles
// the case where the removing entry reaches this peer; when it never does (the peer was cut off), the peer
// asks the others once it has gone without a leader for a while.
func (n *Node) membershipLoop() {
	defer n.bgWG.Done()
	t := time.NewTicker(n.cfg.HeartbeatTimeout)
	defer t.Stop()
	var leaderless time.Time
	for {
		select {
		case <-n.shutdown:
			return
		case <-t.C:
		}
		servers, err := n.Servers()
		if err != nil {
			continue
		}
		member := false
		for _, s := range servers {
			member = member || s.ID == n.cfg.ID
		}
		if member {
			n.everMember.Store(true)
		}
		if n.raft.State() == raft.Shutdown || (!member && n.everMember.Load()) {
			n.markRemoved()
			return
		}
		if leader, _ := n.Leader(); leader != "" || !member {
			leaderless = time.Time{}
			continue
		}
		if leaderless.IsZero() {
			leaderless = time.Now()
			continue
		}
		if time.Since(leaderless) < 5*n.cfg.ElectionTimeout {
			continue
		}
		leaderless = time.Now()
		if n.removedAccordingToPeers(servers) {
			n.markRemoved()
			return
		}
	}
}

func (n *Node) removedAccordingToPeers(servers []ServerInfo) bool {
	for _, s := range servers {
		if s.ID == n.cfg.ID {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := n.Status(ctx, s.Address)
		cancel()
		if err != nil || st.LeaderID == "" || len(st.Servers) == 0 {
			continue
		}
		for _, id := range st.Servers {
			if id == n.cfg.ID {
				return false
			}
		}
		return true // a peer with a leader has a configuration without us
	}
	return false
}

func (n *Node) markRemoved() {
	n.removedOnce.Do(func() {
		n.logger.Warn("this server was removed from the cluster; shutting down raft")
		close(n.removed)
		go n.raft.Shutdown()
	})
}

// SaveSnapshot writes a snapshot of the store to w, consistent with every write acknowledged before the
// call. It is taken from this peer's store, after a linearizable read barrier.
func (n *Node) SaveSnapshot(ctx context.Context, w io.Writer) (int64, error) {
	if err := n.LinearizableRead(ctx); err != nil {
		return 0, err
	}
	return n.store.Snapshot().WriteTo(w)
}

// RestoreSnapshot replaces the whole cluster's state with a snapshot file. It must run on the leader. The
// file is verified completely before Raft sees it. Afterwards a no-op moves the revision past every revision
// clients have seen, and every open watch ends with Compacted.
func (n *Node) RestoreSnapshot(ctx context.Context, path string) (fsm.SnapshotInfo, error) {
	f, err := os.Open(path)
	if err != nil {
		return fsm.SnapshotInfo{}, err
	}
	defer f.Close()
	info, err := fsm.InspectSnapshot(f)
	if err != nil {
		return info, err
	}
	if !n.IsLeader() {
		return info, ErrNotLeader
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return info, err
	}
	var restore io.Reader = f
	size := info.Bytes
	if last := n.raft.LastIndex(); info.Revision >= int64(last) || info.Applied >= last {
		// A snapshot of another cluster (a disaster restore into new servers), further along its log than
		// this one: its revisions come down below this log's index, as fsm.RebaseSnapshot explains.
		var rebased bytes.Buffer
		if _, err := fsm.RebaseSnapshot(f, &rebased, int64(last)); err != nil {
			return info, err
		}
		n.logger.Info("restoring a snapshot ahead of this cluster's log: its revisions are rebased", "snapshot_revision", info.Revision, "log_index", last)
		restore, size = &rebased, int64(rebased.Len())
	}
	meta := &raft.SnapshotMeta{Version: raft.SnapshotVersionMax, Size: size}
	if err := n.raft.Restore(meta, restore, n.cfg.ApplyTimeout); err != nil {
		return info, mapLeaderErr(err)
	}
	_, err = n.Apply(ctx, &fsm.Command{Type: fsm.CmdNoop})
	return info, err
}
