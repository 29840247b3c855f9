package server

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/skiff-dev/skiff/fsm"
	"github.com/skiff-dev/skiff/gossip"
	"github.com/skiff-dev/skiff/raftnode"
)

// bootstrapPlan decides, from the servers this peer sees in gossip, whether it should bootstrap and with
// which configuration. It is a pure function so that start orders can be tested exhaustively.
//
// A configuration is bootstrapped only when this peer sees exactly `expect` alive servers, all configured
// with the same bootstrap_expect, itself among them. Every peer that sees the same set computes the same
// configuration, so several peers bootstrapping at once agree. Seeing more servers than expected is a
// misconfiguration (or a cluster that already formed) and is refused, so two different sets can never both be
// bootstrapped by peers that each see the whole pool.
func bootstrapPlan(self string, expect int, servers []gossip.Member) ([]raftnode.Server, error) {
	if len(servers) < expect {
		return nil, fmt.Errorf("waiting for servers: %d of %d seen", len(servers), expect)
	}
	if len(servers) > expect {
		return nil, fmt.Errorf("found %d servers but bootstrap_expect is %d; not bootstrapping", len(servers), expect)
	}
	var out []raftnode.Server
	found := false
	for _, m := range servers {
		if m.Meta.BootstrapExpect != expect {
			return nil, fmt.Errorf("server %s has bootstrap_expect %d, this server %d; not bootstrapping", m.Name, m.Meta.BootstrapExpect, expect)
		}
		if m.Meta.RaftAddr == "" {
			return nil, fmt.Errorf("server %s advertises no raft address", m.Name)
		}
		found = found || m.Name == self
		out = append(out, raftnode.Server{ID: m.Name, Address: m.Meta.RaftAddr})
	}
	if !found {
		return nil, fmt.Errorf("this server is not among the discovered servers")
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// runBootstrap waits until bootstrapPlan says go, checks over RPC that no discovered server already belongs
// to a cluster, and bootstraps. A peer with Raft state never gets here. It returns when bootstrapped, when a
// leader appears (this peer was added to an existing cluster), or when ctx ends.
func (s *Server) runBootstrap(ctx context.Context) {
	expect := s.cfg.BootstrapExpect
	var lastReason string
	for {
		if leader, _ := s.node.Leader(); leader != "" {
			return
		}
		plan, err := bootstrapPlan(s.cfg.Name, expect, s.pool.Alive(gossip.RoleServer))
		if err == nil {
			err = s.checkNoExistingCluster(ctx, plan)
		}
		if err == nil {
			if s.node.HasState() {
				return // a configuration arrived from a leader meanwhile
			}
			if err = s.node.Bootstrap(plan); err == nil {
				s.logger.Info("bootstrapped raft cluster", "servers", fmt.Sprint(plan))
				return
			}
		}
		if reason := err.Error(); reason != lastReason {
			s.logger.Info("not bootstrapping yet", "reason", reason)
			lastReason = reason
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (s *Server) checkNoExistingCluster(ctx context.Context, plan []raftnode.Server) error {
	for _, p := range plan {
		if p.ID == s.cfg.Name {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := s.node.Status(cctx, p.Address)
		cancel()
		if err != nil {
			return fmt.Errorf("cannot ask %s whether it has raft state: %v", p.ID, err)
		}
		if st.HasState && len(st.Servers) > 0 {
			return fmt.Errorf("server %s already belongs to a cluster; waiting to be added by its leader", p.ID)
		}
	}
	return nil
}

// removedPrefix holds one key per server an operator removed, whose value is the boot ID of the run that
// was removed. That run is not re-added while it lingers in gossip; a restart (new boot ID) joins again.
const removedPrefix = "/skiff/raft/removed/"

func (s *Server) removedRun(m gossip.Member) bool {
	kv, _, err := s.node.Store().Get(removedPrefix + m.Name)
	return err == nil && string(kv.Value) == m.Meta.BootID
}

// removeServer removes a server from Raft after recording its current run as removed.
func (s *Server) removeServer(ctx context.Context, name string) error {
	if m, ok := s.pool.Member(name); ok && m.Meta.BootID != "" {
		key := removedPrefix + name
		cmd := &fsm.Command{Type: fsm.CmdTxn, Txn: &fsm.Txn{Success: []fsm.Op{{Type: fsm.OpPut, Key: key, Value: []byte(m.Meta.BootID)}}}}
		if _, err := s.node.Apply(ctx, cmd); err != nil {
			return err
		}
	}
	return s.node.RemoveServer(name)
}
