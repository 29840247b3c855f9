package server

import (
	"context"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/skiff-dev/skiff/gossip"
)

// Health is the cluster's health as the leader sees it: GET /v1/operator/health, `skiff operator health`.
// Healthy means a leader, every voter healthy, and no agent dead (left, that is stopped on purpose, is fine).
type Health struct {
	Leader  string `json:"leader"`
	Healthy bool   `json:"healthy"`
	// FailureTolerance is how many more voters may fail with the cluster still keeping a quorum: healthy
	// voters minus the quorum, as Consul's autopilot counts it.
	FailureTolerance int            `json:"failureTolerance"`
	Servers          []ServerHealth `json:"servers"`
	Agents           []AgentHealth  `json:"agents"`
}

// ServerHealth is one server in the Raft configuration.
type ServerHealth struct {
	Name    string `json:"name"`
	Address string `json:"address"`
	Voter   bool   `json:"voter"`
	Leader  bool   `json:"leader"`
	// Gossip is the server's member state (alive, dead, left), or "unknown".
	Gossip string `json:"gossip"`
	// LastContactMillis is how long ago the server last heard from the leader (0 for the leader); -1 when
	// it did not answer.
	LastContactMillis int64 `json:"lastContactMillis"`
	// AppliedLag is how many entries the leader's last index is ahead of what the server applied.
	AppliedIndex uint64 `json:"appliedIndex"`
	AppliedLag   uint64 `json:"appliedLag"`
	Healthy      bool   `json:"healthy"`
	Reason       string `json:"reason,omitempty"`
}

// AgentHealth is one node agent in gossip.
type AgentHealth struct {
	Name  string `json:"name"`
	State string `json:"state"`
	Nodes int    `json:"nodes"`
}

// Health thresholds, as autopilot's defaults scaled to Skiff's Raft timeouts: a server is unhealthy when it
// has not heard from the leader for maxLastContact, or lags by more than maxAppliedLag entries.
const (
	maxLastContact = 2 * time.Second
	maxAppliedLag  = 1000
)

// health answers GET /v1/operator/health on the leader: it asks every server of the configuration for its
// status over the Raft port's RPC, at once, and reads the agents from gossip.
func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	servers, err := s.node.Servers()
	if err != nil {
		writeError(w, err)
		return
	}
	leaderID, _ := s.node.Leader()
	leaderLast := s.node.Stats()["last_log_index"]
	h := Health{Leader: leaderID, Servers: make([]ServerHealth, len(servers)), Agents: []AgentHealth{}}
	var wg sync.WaitGroup
	for i, sv := range servers {
		h.Servers[i] = ServerHealth{Name: sv.ID, Address: sv.Address, Voter: sv.Voter, Leader: sv.Leader, Gossip: "unknown", LastContactMillis: -1}
		if m, ok := s.pool.Member(sv.ID); ok {
			h.Servers[i].Gossip = string(m.Status)
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
			defer cancel()
			st, err := s.node.Status(ctx, sv.Address)
			out := &h.Servers[i]
			if err != nil {
				out.Reason = "no answer: " + err.Error()
				return
			}
			out.AppliedIndex = st.AppliedIndex
			if leaderLast > st.AppliedIndex {
				out.AppliedLag = leaderLast - st.AppliedIndex
			}
			switch {
			case st.SinceLeaderContact < 0:
				out.Reason = "has never heard from the leader"
			case st.LeaderID != leaderID:
				out.Reason = "follows another leader: " + st.LeaderID
			case st.SinceLeaderContact > maxLastContact:
				out.Reason = "has not heard from the leader for " + st.SinceLeaderContact.Round(time.Millisecond).String()
			case out.AppliedLag > maxAppliedLag:
				out.Reason = "lags behind the leader"
			default:
				out.Healthy = true
			}
			if st.SinceLeaderContact >= 0 {
				out.LastContactMillis = st.SinceLeaderContact.Milliseconds()
			}
		})
	}
	wg.Wait()
	voters, healthyVoters := 0, 0
	for _, sv := range h.Servers {
		if sv.Voter {
			voters++
			if sv.Healthy {
				healthyVoters++
			}
		}
	}
	h.FailureTolerance = max(0, healthyVoters-(voters/2+1))
	agentFailed := false
	for _, m := range s.pool.Members() {
		if m.Meta.Role != gossip.RoleAgent {
			continue
		}
		h.Agents = append(h.Agents, AgentHealth{Name: m.Name, State: string(m.Status), Nodes: len(m.Meta.Nodes) + m.Meta.NodeCount})
		agentFailed = agentFailed || m.Status == gossip.StatusDead
	}
	sort.Slice(h.Agents, func(i, j int) bool { return h.Agents[i].Name < h.Agents[j].Name })
	h.Healthy = leaderID != "" && healthyVoters == voters && !agentFailed
	writeJSON(w, h)
}
