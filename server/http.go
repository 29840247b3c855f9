package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/component-base/metrics/legacyregistry"

	"github.com/skiff-dev/skiff/apiserver/raftstore"
	"github.com/skiff-dev/skiff/fsm"
	"github.com/skiff-dev/skiff/internal/join"
	"github.com/skiff-dev/skiff/internal/version"
)

// PeerInfo is one row of `skiff operator raft list-peers`.
type PeerInfo struct {
	Name    string `json:"name"`
	ID      string `json:"id"`
	Address string `json:"address"`
	State   string `json:"state"` // leader or follower
	Voter   bool   `json:"voter"`
}

// MemberInfo is one row of `skiff operator members`.
type MemberInfo struct {
	Name    string `json:"name"`
	Address string `json:"address"`
	Status  string `json:"status"`
	Role    string `json:"role"`
	Raft    string `json:"raft,omitempty"`
	API     string `json:"api,omitempty"`
	// Nodes are the Nodes an agent hosts: their names, or for many a range such as "sim-0..sim-4999".
	Nodes     []string `json:"nodes,omitempty"`
	NodeCount int      `json:"nodeCount,omitempty"`
	Version   string   `json:"version,omitempty"`
}

// RaftState is the answer of GET /v1/operator/raft/state: this server's applied Raft index and the digest of
// its replicated state at that index (fsm.Store.StateHash). Once faults stop, every server must report the
// same pair; the goroutine count lets a fault suite spot leaks.
type RaftState struct {
	Name         string `json:"name"`
	AppliedIndex uint64 `json:"appliedIndex"`
	StateHash    string `json:"stateHash"`
	Goroutines   int    `json:"goroutines"`
	// Log is the peer's log indexes (first, last, commit, applied) and snapshot installs, for diagnostics.
	Log map[string]uint64 `json:"log"`
}

// forwardedHeader marks a request a follower proxied to the leader, so it is never proxied twice.
const forwardedHeader = "X-Skiff-Forwarded-By"

// bootstrapRoutes serve the API port until the API server starts (the cluster CA and admin token have
// replicated here, which after a restart means until this peer has caught up): health only. Anything else is
// 503 with Retry-After, never 404: a client must not take "not serving yet" for "no such object".
func (s *Server) bootstrapRoutes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /livez", s.livez)
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.HandleFunc("GET "+join.ServerCAPath, s.serverCAHandler)
	mux.HandleFunc("POST "+join.ServerJoinPath, s.serverJoinHandler)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		msg := "this server is starting: the API is not served yet"
		if why, _ := s.apiBlocked.Load().(string); why != "" {
			msg += ": " + why
		}
		writeStatus(w, http.StatusServiceUnavailable, "ServiceUnavailable", msg)
	})
	return mux
}

// operatorRoutes are mounted in the API server under /v1/operator/, behind its authentication.
func (s *Server) operatorRoutes() http.Handler {
	mux := http.NewServeMux()
	for _, r := range []struct {
		pattern    string
		leaderOnly bool
		handler    http.HandlerFunc
	}{
		{"GET /v1/operator/raft/peers", false, s.listPeers},
		{"GET /v1/operator/raft/state", false, s.raftState},
		{"DELETE /v1/operator/raft/peers/{name}", true, s.removePeer},
		{"POST /v1/operator/raft/transfer-leadership", true, s.transferLeadership},
		{"GET /v1/operator/snapshot", false, s.saveSnapshot},
		{"PUT /v1/operator/snapshot", true, s.restoreSnapshot},
		{"GET /v1/operator/members", false, s.listMembers},
		{"GET /v1/operator/health", true, s.health},
		{"GET /v1/operator/gossip/keyring", false, s.listGossipKeyring},
		{"POST /v1/operator/gossip/keyring/install", true, s.changeGossipKeyring(installKey)},
		{"POST /v1/operator/gossip/keyring/use", true, s.changeGossipKeyring(useKey)},
		{"POST /v1/operator/gossip/keyring/remove", true, s.changeGossipKeyring(removeKey)},
		{"POST /v1/operator/join-token/rotate", false, s.rotateJoinToken},
		{"GET /v1/operator/debug/logs", false, s.debugLogs},
		{"GET " + encryptionPath, false, s.encryptionReport},
		{"GET " + encryptionPath + "/local", false, s.localEncryptionStatus},
		{"PUT " + encryptionPath + "/config", false, s.putEncryptionConfig},
		{"POST " + encryptionPath + "/rotate", true, s.rotateEncryption},
	} {
		h := r.handler
		if r.leaderOnly {
			h = s.onLeader(h)
		}
		mux.Handle(r.pattern, h)
	}
	return mastersOnly(mux)
}

// mastersOnly keeps the operator endpoints (snapshots hold the CA key) for system:masters; node agents are
// authenticated users too.
func mastersOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, ok := request.UserFrom(r.Context()); ok && slices.Contains(u.GetGroups(), user.SystemPrivilegedGroup) {
			h.ServeHTTP(w, r)
			return
		}
		writeStatus(w, http.StatusForbidden, "Forbidden", "the operator endpoints are for cluster administrators (system:masters)")
	})
}

// caForAgents serves the cluster CA with its HMAC under the join token, so that an agent that has only the
// token can check the CA before trusting it (package join).
func (s *Server) caForAgents(caPEM []byte) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			writeStatus(w, http.StatusMethodNotAllowed, "MethodNotAllowed", "only GET is allowed")
			return
		}
		token := s.joinToken()
		if token == "" {
			writeStatus(w, http.StatusServiceUnavailable, "ServiceUnavailable", "the join token is not replicated here yet")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(join.CAResponse{CA: string(caPEM), HMAC: join.CAHMAC(token, caPEM)})
	})
}

// metricsHandler serves /metrics: Skiff's own metrics (Raft, store, gossip) and the API library's.
func (s *Server) metricsHandler() http.Handler {
	return promhttp.HandlerFor(prometheus.Gatherers{legacyregistry.DefaultGatherer, s.reg}, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

// writeStatus writes an error as a Kubernetes-style Status body.
func writeStatus(w http.ResponseWriter, code int, reason, msg string) {
	if code == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]any{
		"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "message": msg, "code": code,
	})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}

// writeError maps errors of the Raft layer to HTTP as the API's storage maps them
// (raftstore.MapBackendError), and a snapshot that cannot be restored to 400.
func writeError(w http.ResponseWriter, err error) {
	if errors.Is(err, fsm.ErrCorruptSnapshot) || errors.Is(err, fsm.ErrNewerSnapshot) {
		writeStatus(w, http.StatusBadRequest, "BadRequest", err.Error())
		return
	}
	var status apierrors.APIStatus
	if errors.As(raftstore.MapBackendError(err), &status) {
		st := status.Status()
		writeStatus(w, int(st.Code), string(st.Reason), st.Message)
		return
	}
	writeStatus(w, http.StatusInternalServerError, "InternalError", err.Error())
}

// onLeader runs h on the leader: a follower proxies the request to the leader's API address, found in gossip.
func (s *Server) onLeader(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.node.IsLeader() {
			h(w, r)
			return
		}
		leaderID, _ := s.node.Leader()
		m, ok := s.pool.Member(leaderID)
		if leaderID == "" || !ok || m.Meta.APIAddr == "" || r.Header.Get(forwardedHeader) != "" {
			writeStatus(w, http.StatusServiceUnavailable, "ServiceUnavailable", "no leader is known to this server; retry")
			return
		}
		target := &url.URL{Scheme: "https", Host: m.Meta.APIAddr}
		proxy := httputil.NewSingleHostReverseProxy(target)
		proxy.Transport = s.peerTransport()
		proxy.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
			writeStatus(w, http.StatusServiceUnavailable, "ServiceUnavailable", fmt.Sprintf("forwarding to leader %s: %v", leaderID, err))
		}
		r.Header.Set(forwardedHeader, s.cfg.Name)
		// The API's authentication strips the caller's credentials once checked, and mastersOnly has
		// admitted the caller; the leader gets this server's admin credential instead.
		token, ok := s.adminToken()
		if !ok {
			writeStatus(w, http.StatusServiceUnavailable, "ServiceUnavailable", "the admin token has not replicated here yet")
			return
		}
		r.Header.Set("Authorization", "Bearer "+token)
		proxy.ServeHTTP(w, r)
	}
}

func (s *Server) livez(w http.ResponseWriter, r *http.Request) {
	if s.node.State() == "Shutdown" {
		writeStatus(w, http.StatusServiceUnavailable, "ServiceUnavailable", "raft is shut down")
		return
	}
	io.WriteString(w, "ok\n")
}

// readyz is the bootstrap server's: it holds the API port until the Kubernetes API is built. It is ready
// once the peer knows a leader and has applied everything the leader committed, while the cluster has no CA
// yet (a cluster being formed has no Kubernetes API to wait for). Once the CA is there, this server's
// Kubernetes API is about to take the port and will answer /readyz itself; until it does, this one says not
// ready, because the port is then closed and opened again, and a client told "ok" would be refused meanwhile.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if _, _, err := s.openSecret(clusterCAKey); err == nil {
		writeStatus(w, http.StatusServiceUnavailable, "ServiceUnavailable", "not ready: the Kubernetes API is starting")
		return
	} else if !errors.Is(err, fsm.ErrNotFound) {
		writeStatus(w, http.StatusServiceUnavailable, "ServiceUnavailable", "not ready: the Kubernetes API cannot start: "+err.Error())
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.node.LinearizableRead(ctx); err != nil {
		writeStatus(w, http.StatusServiceUnavailable, "ServiceUnavailable", "not ready: "+err.Error())
		return
	}
	io.WriteString(w, "ok\n")
}

func (s *Server) listPeers(w http.ResponseWriter, r *http.Request) {
	servers, err := s.node.Servers()
	if err != nil {
		writeError(w, err)
		return
	}
	out := []PeerInfo{}
	for _, sv := range servers {
		state := "follower"
		if sv.Leader {
			state = "leader"
		}
		out = append(out, PeerInfo{Name: sv.ID, ID: sv.ID, Address: sv.Address, State: state, Voter: sv.Voter})
	}
	writeJSON(w, out)
}

// raftState reports this server's own state, read locally with no leader round trip: the point is to compare
// the servers with one another.
func (s *Server) raftState(w http.ResponseWriter, r *http.Request) {
	applied, hash := s.node.Store().StateHash()
	writeJSON(w, RaftState{Name: s.cfg.Name, AppliedIndex: applied, StateHash: hash, Goroutines: runtime.NumGoroutine(), Log: s.node.Stats()})
}

func (s *Server) removePeer(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if name == s.cfg.Name {
		writeStatus(w, http.StatusBadRequest, "BadRequest", "cannot remove the leader; transfer leadership first")
		return
	}
	if err := s.removeServer(r.Context(), name); err != nil {
		if strings.Contains(err.Error(), "no server") {
			writeStatus(w, http.StatusNotFound, "NotFound", err.Error())
			return
		}
		writeError(w, err)
		return
	}
	writeJSON(w, map[string]string{"removed": name})
}

func (s *Server) transferLeadership(w http.ResponseWriter, r *http.Request) {
	to := r.URL.Query().Get("to")
	if err := s.node.TransferLeadership(to); err != nil {
		if strings.Contains(err.Error(), "no server") {
			writeStatus(w, http.StatusNotFound, "NotFound", err.Error())
			return
		}
		writeError(w, err)
		return
	}
	leader, _ := s.node.Leader()
	writeJSON(w, map[string]string{"leader": leader})
}

func (s *Server) saveSnapshot(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	// Read-barrier first, so an error can still become a status code before the body starts.
	if err := s.node.LinearizableRead(ctx); err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	if _, err := s.node.Store().Snapshot().WriteTo(w); err != nil {
		s.logger.Warn("streaming snapshot", "error", err)
	}
}

// restoreSnapshot receives the snapshot into a temp file, verifies it, and restores it through Raft.
func (s *Server) restoreSnapshot(w http.ResponseWriter, r *http.Request) {
	tmp, err := os.CreateTemp(s.cfg.DataDir, "restore-*.snap")
	if err != nil {
		writeError(w, err)
		return
	}
	defer os.Remove(tmp.Name())
	_, err = io.Copy(tmp, r.Body)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		writeStatus(w, http.StatusBadRequest, "BadRequest", "reading snapshot upload: "+err.Error())
		return
	}
	identity := s.clusterIdentity()
	info, err := s.node.RestoreSnapshot(r.Context(), tmp.Name())
	if err != nil {
		writeError(w, err)
		return
	}
	res := RestoreResult{SnapshotInfo: info, IdentityChanged: s.clusterIdentity() != identity}
	s.logger.Info("restored snapshot", "revision", info.Revision, "keys", info.Keys, "identity_changed", res.IdentityChanged)
	writeJSON(w, res)
}

// RestoreResult is the answer to a snapshot restore.
type RestoreResult struct {
	fsm.SnapshotInfo
	// IdentityChanged says the snapshot holds another cluster CA, admin or join token, or service account key
	// than the cluster had (a disaster restore into new servers): the servers take them at their next start.
	IdentityChanged bool `json:"identityChanged,omitempty"`
}

// clusterIdentity is a digest of the stored keys that make the cluster who it is to its clients: the CA, the
// tokens and the service account signing key.
func (s *Server) clusterIdentity() string {
	h := sha256.New()
	for _, key := range []string{clusterCAKey, adminTokenKey, joinTokenKey, serviceAccountKeyKey} {
		plain, _, err := s.openSecret(key)
		if err != nil && !errors.Is(err, fsm.ErrNotFound) {
			plain = []byte(err.Error()) // unreadable with this cluster's keys: not this cluster's
		}
		h.Write(plain)
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

func (s *Server) listMembers(w http.ResponseWriter, r *http.Request) {
	out := []MemberInfo{}
	for _, m := range s.pool.Members() {
		info := MemberInfo{Name: m.Name, Address: m.Addr, Status: string(m.Status), Role: m.Meta.Role, Raft: m.Meta.RaftAddr, API: m.Meta.APIAddr, Version: m.Meta.Version,
			Nodes: m.Meta.Nodes, NodeCount: len(m.Meta.Nodes) + m.Meta.NodeCount}
		if m.Meta.NodeCount > 0 {
			info.Nodes = append(info.Nodes, fmt.Sprintf("%s-0..%s-%d", m.Meta.NodePrefix, m.Meta.NodePrefix, m.Meta.NodeCount-1))
		}
		out = append(out, info)
	}
	writeJSON(w, out)
}

// onlyMethod answers 405 to any method but m, for handlers mounted by path alone.
func onlyMethod(m string, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != m {
			writeStatus(w, http.StatusMethodNotAllowed, "MethodNotAllowed", "only "+m+" is allowed")
			return
		}
		h(w, r)
	})
}

// debugLogs serves this process's most recent log lines (the tail `skiff server` keeps in memory), for the
// debug bundle.
func (s *Server) debugLogs(w http.ResponseWriter, _ *http.Request) {
	if s.logTail == nil {
		writeStatus(w, http.StatusNotFound, "NotFound", "this server keeps no log tail")
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Write(s.logTail())
}

// serveVersion says this server's Skiff version, for agents to check the version skew policy before they
// join (internal/version).
func serveVersion(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, version.Info{Version: version.Version})
}
