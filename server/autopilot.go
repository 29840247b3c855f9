package server

import (
	"context"
	"time"

	"github.com/skiff-dev/skiff/gossip"
	"github.com/skiff-dev/skiff/raftnode"
)

// autopilot is a leader service that keeps the Raft configuration in step with the servers in gossip, as
// Consul's autopilot does:
//   - a server alive in gossip but not in the configuration joins it as a non-voter (a server that moved
//     gets its new address);
//   - a non-voter becomes a voter once it has been healthy (alive, following this leader, caught up) for
//     server_stabilization_time, so a server that flaps as it starts never counts toward the quorum;
//   - a server dead or gone from gossip for dead_server_cleanup is removed, a voter only while the voters
//     left number at least bootstrap_expect: a dead voter of a three-server cluster stays until a new server
//     has taken its place.
//
// Its clocks start with each leadership term, so a new leader waits the full times again.
func (s *Server) autopilot(ctx context.Context) {
	events, cancel := s.pool.Subscribe()
	defer func() { cancel() }()
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	healthySince, deadSince := map[string]time.Time{}, map[string]time.Time{}
	for {
		if servers, err := s.node.Servers(); err == nil {
			s.addServers(ctx, servers)
			s.promoteStable(ctx, servers, healthySince)
			s.cleanupDead(ctx, servers, deadSince)
		}
		select {
		case <-ctx.Done():
			return
		case _, ok := <-events:
			if !ok { // cut off: resubscribe, the loop rereads the table anyway
				events, cancel = s.pool.Subscribe()
			}
		case <-tick.C:
		}
	}
}

// addServers adds alive servers the configuration lacks, as non-voters, and updates moved addresses.
func (s *Server) addServers(ctx context.Context, servers []raftnode.ServerInfo) {
	known := map[string]raftnode.ServerInfo{}
	for _, sv := range servers {
		known[sv.ID] = sv
	}
	for _, m := range s.pool.Alive(gossip.RoleServer) {
		sv, ok := known[m.Name]
		if m.Meta.RaftAddr == "" || (ok && sv.Address == m.Meta.RaftAddr) || s.removedRun(m) {
			continue
		}
		var err error
		if ok && sv.Voter {
			s.logger.Info("updating a voter's address", "server", m.Name, "address", m.Meta.RaftAddr)
			err = s.node.AddVoter(m.Name, m.Meta.RaftAddr)
		} else {
			s.logger.Info("adding server as a non-voter until it is stable", "server", m.Name, "address", m.Meta.RaftAddr)
			err = s.node.AddNonvoter(m.Name, m.Meta.RaftAddr)
		}
		if err != nil && ctx.Err() == nil {
			s.logger.Warn("adding server failed", "server", m.Name, "error", err)
		}
	}
}

// promoteStable makes voters of the non-voters that have been healthy for the stabilization time.
func (s *Server) promoteStable(ctx context.Context, servers []raftnode.ServerInfo, healthySince map[string]time.Time) {
	leader := s.cfg.Name
	last := s.node.Stats()["last_log_index"]
	for _, sv := range servers {
		if sv.Voter {
			delete(healthySince, sv.ID)
			continue
		}
		m, ok := s.pool.Member(sv.ID)
		healthy := ok && m.Status == gossip.StatusAlive
		if healthy {
			sctx, cancel := context.WithTimeout(ctx, time.Second)
			st, err := s.node.Status(sctx, sv.Address)
			cancel()
			healthy = err == nil && st.LeaderID == leader && st.AppliedIndex+maxAppliedLag >= last
		}
		if !healthy {
			delete(healthySince, sv.ID)
			continue
		}
		since, ok := healthySince[sv.ID]
		if !ok {
			healthySince[sv.ID] = time.Now()
			continue
		}
		if time.Since(since) < s.cfg.ServerStabilizationTime {
			continue
		}
		s.logger.Info("promoting a stable server to voter", "server", sv.ID, "healthy_for", time.Since(since).Round(time.Second))
		if err := s.node.AddVoter(sv.ID, sv.Address); err != nil && ctx.Err() == nil {
			s.logger.Warn("promoting server failed", "server", sv.ID, "error", err)
		}
	}
}

// cleanupDead removes servers dead (or gone) in gossip for dead_server_cleanup, never taking the voters
// below bootstrap_expect.
func (s *Server) cleanupDead(ctx context.Context, servers []raftnode.ServerInfo, deadSince map[string]time.Time) {
	voters := 0
	for _, sv := range servers {
		if sv.Voter {
			voters++
		}
	}
	for _, sv := range servers {
		m, ok := s.pool.Member(sv.ID)
		if sv.ID == s.cfg.Name || (ok && m.Status == gossip.StatusAlive) {
			delete(deadSince, sv.ID)
			continue
		}
		since, seen := deadSince[sv.ID]
		if !seen {
			deadSince[sv.ID] = time.Now()
			continue
		}
		if s.cfg.DeadServerCleanup <= 0 || time.Since(since) < s.cfg.DeadServerCleanup || (sv.Voter && voters-1 < s.cfg.BootstrapExpect) {
			continue
		}
		s.logger.Warn("removing a dead server", "server", sv.ID, "dead_for", time.Since(since).Round(time.Second), "voter", sv.Voter)
		if err := s.removeServer(ctx, sv.ID); err != nil {
			if ctx.Err() == nil {
				s.logger.Warn("removing a dead server failed", "server", sv.ID, "error", err)
			}
			continue
		}
		delete(deadSince, sv.ID)
		if sv.Voter {
			voters--
		}
	}
}
