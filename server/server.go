package server

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/server/healthz"

	"github.com/skiff-dev/skiff/apiserver"
	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/fsm"
	"github.com/skiff-dev/skiff/gossip"
	"github.com/skiff-dev/skiff/internal/join"
	"github.com/skiff-dev/skiff/internal/memshare"
	"github.com/skiff-dev/skiff/internal/podroutes"
	"github.com/skiff-dev/skiff/internal/version"
	"github.com/skiff-dev/skiff/raftnode"
)

// Server is one running control-plane peer.
type Server struct {
	cfg     *config.Server
	logger  hclog.Logger
	logTail func() []byte // nil when the process keeps no log tail
	node    *raftnode.Node
	pool    *gossip.Pool
	// termInformers are the informers the current leader term's controllers and scheduler share.
	termInformers leaderInformers
	// pki is the cluster CA and this server's certificate for the Raft port; token the cluster token.
	pki   *raftPKI
	token join.Token
	// enc encrypts values at rest: the API's resources its configuration lists, and the server's own secrets.
	enc *encryptionAtRest
	// apiBlocked says why the API cannot start, when it is the operator's to fix; "" otherwise.
	apiBlocked atomic.Value
	rotateMu   sync.Mutex // one encryption key rotation at a time
	http       *http.Server
	ln         net.Listener
	reg        *prometheus.Registry
	// shared holds the objects of this peer's watch caches, whose memory its informers share.
	shared *memshare.Registry

	// saKey is the parsed service account signing key, kept while the stored PEM is unchanged.
	saKeyMu  sync.Mutex
	saKey    *ecdsa.PrivateKey
	saKeyPEM []byte

	// rbacPolicyReady is closed once this process's API server has reconciled the bootstrap RBAC policy; the
	// scheduler and controllers wait for it.
	rbacPolicyReady chan struct{}
	rbacPolicyOnce  sync.Once

	cancel   context.CancelFunc
	wg       sync.WaitGroup
	stopOnce sync.Once
	done     chan struct{}
}

// Options are knobs for tests and dev mode that operators do not set in HCL.
type Options struct {
	// LocalGossip selects memberlist's loopback timings.
	LocalGossip bool
	// LogTail returns the process's most recent log lines, for `skiff operator debug`; nil serves none.
	LogTail func() []byte
}

// New starts a peer: Raft (from existing state if any), gossip, the HTTP endpoints, and bootstrap when this
// peer has no state yet.
func New(cfg *config.Server, logger hclog.Logger, opts Options) (*Server, error) {
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, err
	}
	// Every server has the manifests folder, for the operator to fill; the leader applies it.
	if cfg.ManifestsDir != "" {
		if err := os.MkdirAll(cfg.ManifestsDir, 0o755); err != nil {
			return nil, fmt.Errorf("creating the manifests folder: %w", err)
		}
	}
	s := &Server{cfg: cfg, logger: logger, logTail: opts.LogTail, reg: prometheus.NewRegistry(), shared: memshare.NewRegistry(), done: make(chan struct{}), rbacPolicyReady: make(chan struct{}),
		pki: &raftPKI{dir: filepath.Join(cfg.DataDir, signingCADir)}}
	var err error
	if s.token, err = clusterToken(cfg); err != nil {
		return nil, err
	}
	if s.enc, err = newEncryptionAtRest(cfg); err != nil {
		return nil, err
	}
	if loaded, err := s.pki.load(); err != nil {
		return nil, fmt.Errorf("reading the Raft certificate under %s: %w", s.pki.dir, err)
	} else if loaded {
		if err := s.pki.renewIfOld(cfg.Name); err != nil {
			logger.Warn("renewing the Raft certificate", "error", err)
		}
	}
	rc := raftnode.DefaultConfig()
	rc.ID = cfg.Name
	rc.DataDir = cfg.DataDir
	rc.BindAddr = cfg.RaftAddr()
	rc.AdvertiseAddr = cfg.AdvertiseRaftAddr()
	rc.HeartbeatTimeout = cfg.HeartbeatTimeout
	rc.ElectionTimeout = cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.LeaderLeaseTimeout
	rc.SnapshotThreshold = cfg.SnapshotThreshold
	rc.SnapshotInterval = cfg.SnapshotInterval
	rc.TrailingLogs = cfg.TrailingLogs
	rc.ApplyTimeout = cfg.WriteTimeout
	rc.Store = fsm.Options{HistoryEvents: cfg.HistoryEvents, HistoryAge: cfg.HistoryAge}
	rc.Logger = logger
	rc.Layer = raftnode.TLSLayer{Creds: s.pki}
	if s.node, err = raftnode.New(rc); err != nil {
		return nil, err
	}
	if s.ln, err = net.Listen("tcp", cfg.APIAddr()); err != nil {
		s.node.Shutdown()
		return nil, fmt.Errorf("listening for the API on %s: %w", cfg.APIAddr(), err)
	}
	s.pool, err = gossip.New(gossip.Config{
		Name: cfg.Name, BindAddr: cfg.BindAddr, BindPort: cfg.Ports.Gossip, AdvertiseAddr: cfg.AdvertiseAddr,
		Meta: gossip.Meta{
			Role: gossip.RoleServer, RaftAddr: cfg.AdvertiseRaftAddr(), APIAddr: cfg.AdvertiseAPIAddr(),
			BootstrapExpect: cfg.BootstrapExpect, BootID: bootID(), Version: version.Version,
		},
		RetryJoin: cfg.RetryJoin, RetryInterval: cfg.RetryInterval, EncryptKey: cfg.Encrypt,
		// Without `encrypt`, gossip is encrypted with a key derived from the cluster token, which agents derive
		// from their join token alike; after a rotation the keyring file holds the keys.
		DefaultKey: gossip.KeyFromSecret(s.token.Secret), KeyringFile: filepath.Join(cfg.DataDir, gossip.KeyringFileName),
		PeersFile: filepath.Join(cfg.DataDir, gossipPeersFile), Local: opts.LocalGossip, Logger: logger,
	})
	if err != nil {
		s.ln.Close()
		s.node.Shutdown()
		return nil, err
	}
	s.reg.MustRegister(s.node.Collector(),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "skiff_gossip_members", Help: "Alive gossip members."},
			func() float64 { return float64(len(s.pool.Alive(""))) }))

	s.node.OnLeadership("autopilot", s.autopilot)
	s.node.OnLeadership("cluster-secrets", s.ensureClusterSecrets)
	s.node.OnLeadership("gossip-keyring", s.ensureGossipKeyring)
	s.node.OnLeadership("system-objects", s.runSystemObjects)
	s.node.OnLeadership("controllers", s.runControllers)
	s.node.OnLeadership("scheduler", s.runScheduler)
	s.node.OnLeadership("manifests", s.runManifests)

	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	// Until the cluster has its CA, the API port answers only /livez and /readyz, with a self-signed
	// certificate; then the Kubernetes API takes the port over (serveAPI).
	certs := &servingCerts{s: s}
	s.http = &http.Server{
		Handler: s.bootstrapRoutes(), ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{GetCertificate: certs.get, MinVersion: tls.VersionTLS12},
	}
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		if err := s.http.ServeTLS(s.ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.logger.Error("bootstrap API listener failed", "error", err)
		}
	}()
	go func() {
		defer s.wg.Done()
		s.serveAPI(ctx, certs)
	}()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.ensureRaftPKI(ctx)
		if !s.node.HasState() {
			s.runBootstrap(ctx)
		}
	}()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.followGossipKeyring(ctx)
	}()
	s.logger.Info("server started", "name", cfg.Name, "api", cfg.AdvertiseAPIAddr(), "raft", cfg.AdvertiseRaftAddr(),
		"gossip", net.JoinHostPort(cfg.AdvertiseAddr, fmt.Sprint(cfg.Ports.Gossip)), "data_dir", cfg.DataDir)
	return s, nil
}

// Node returns the peer's Raft node.
func (s *Server) Node() *raftnode.Node { return s.node }

// Pool returns the peer's gossip member.
func (s *Server) Pool() *gossip.Pool { return s.pool }

// clusterTokenFile, under the data dir, keeps the cluster token a single server drew because none was
// configured.
const clusterTokenFile = "cluster-token"

// clusterToken is server.token, or for a server without one (a single server: config requires it with
// bootstrap_expect > 1), the token it drew at its first start.
func clusterToken(cfg *config.Server) (join.Token, error) {
	if cfg.Token.Secret != "" {
		return cfg.Token, nil
	}
	path := filepath.Join(cfg.DataDir, clusterTokenFile)
	if b, err := os.ReadFile(path); err == nil {
		return join.ParseToken(strings.TrimSpace(string(b)))
	} else if !errors.Is(err, os.ErrNotExist) {
		return join.Token{}, err
	}
	secret, err := newToken()
	if err != nil {
		return join.Token{}, err
	}
	if err := writeFileAtomic(path, append(secret, '\n')); err != nil {
		return join.Token{}, err
	}
	return join.Token{Secret: string(secret)}, nil
}

// gossipPeersFile, under the data dir, remembers the gossip members seen, to rejoin through after a restart.
const gossipPeersFile = "gossip-peers.json"

// KubeconfigPath is where the peer writes the admin kubeconfig.
func (s *Server) KubeconfigPath() string { return filepath.Join(s.cfg.DataDir, "admin.kubeconfig") }

// Removed is closed when this peer was removed from the cluster; the process should exit.
func (s *Server) Removed() <-chan struct{} { return s.node.Removed() }

// JoinTokenFile, under the data dir, holds the join token for the operator to hand to agents, with the
// cluster CA's hash (K10<hash>::<secret>) so that an agent checks the CA before it sends the secret.
const JoinTokenFile = "join-token"

// writeJoinToken keeps <data_dir>/join-token (mode 0600) equal to the cluster's join token once it has
// replicated here, rotations included, until ctx ends.
func (s *Server) writeJoinToken(ctx context.Context, caPEM []byte) {
	var written string
	for {
		if secret := s.joinToken(); secret != "" && secret != written {
			tok := join.Token{Secret: secret}.WithCA(caPEM).String()
			if err := writeFileAtomic(filepath.Join(s.cfg.DataDir, JoinTokenFile), []byte(tok+"\n")); err != nil {
				s.logger.Error("writing the join token", "error", err)
			} else {
				written = secret
			}
		}
		if !sleepCtx(ctx, 2*time.Second) {
			return
		}
	}
}

// joinToken is the token node agents join with, once the leader has stored it.
func (s *Server) joinToken() string {
	plain, _, err := s.openSecret(joinTokenKey)
	if err != nil {
		return ""
	}
	return string(plain)
}

func (s *Server) adminToken() (string, bool) {
	plain, _, err := s.openSecret(adminTokenKey)
	if err != nil {
		return "", false
	}
	return string(plain), true
}

// serveAPI waits until the cluster CA and the admin token have replicated here, then serves the Kubernetes
// API on the API port, with a serving certificate issued by the cluster CA, and writes admin.kubeconfig. It
// returns when ctx ends.
func (s *Server) serveAPI(ctx context.Context, certs *servingCerts) {
	var token string
	var caPEM []byte
	for {
		var ok bool
		var err error
		token, ok = s.adminToken()
		caPEM, _, _, err = s.clusterCA()
		if err == nil {
			_, _, _, err = s.storedCA(frontProxyCAKey)
		}
		if ok && err == nil {
			s.apiBlocked.Store("")
			break
		}
		// Not replicated here yet is the common case; a value this server cannot decrypt is the operator's to
		// fix (the wrong encryption configuration), so it says so, in the log and to clients.
		if _, _, derr := s.openSecret(clusterCAKey); derr != nil && !errors.Is(derr, fsm.ErrNotFound) {
			if prev, _ := s.apiBlocked.Swap(derr.Error()).(string); prev != derr.Error() {
				s.logger.Error("the API cannot start", "error", derr)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
	_, caCert, caKey, _ := s.clusterCA()
	certPEM, keyPEM, err := certs.issuePEM(caCert, caKey)
	if err != nil {
		s.logger.Error("issuing the API serving certificate", "error", err)
		return
	}
	frontProxyCAPEM, _, _, _ := s.storedCA(frontProxyCAKey)
	frontProxyCert, frontProxyKey, err := s.writeFrontProxyClientCert()
	if err != nil {
		s.logger.Error("issuing the front-proxy client certificate", "error", err)
		return
	}
	// Hand the port over from the bootstrap listener to the API server.
	shutdownCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	s.http.Shutdown(shutdownCtx)
	cancel()
	var ln net.Listener
	for attempt := 0; ; attempt++ {
		if ln, err = net.Listen("tcp", s.cfg.APIAddr()); err == nil {
			break
		}
		if attempt == 50 || ctx.Err() != nil {
			s.logger.Error("listening for the API", "address", s.cfg.APIAddr(), "error", err)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	if s.cfg.RoutePodCIDRs {
		go func() {
			client, err := s.adminClient(ctx)
			if err != nil {
				s.logger.Error("routing pod CIDRs", "error", err)
				return
			}
			podroutes.Sync(ctx, podroutes.Options{Client: client, Logger: s.logger.Named("podroutes"), Addr: s.cfg.AdvertiseAddr})
		}()
	}
	agentTransport := s.agentTransport(caPEM)
	metrics := newMetricsScraper(&http.Client{Transport: agentTransport, Timeout: metricsScrapeTimeout}, s.nodeLister(ctx), nil, s.logger)
	api, err := apiserver.New(apiserver.Config{
		Backend: s.node, Shared: s.shared, Listener: ln, CertPEM: certPEM, KeyPEM: keyPEM, ClientCAPEM: caPEM, AdminToken: token, JoinToken: s.joinToken, ServiceAccountKey: s.serviceAccountKey,
		Handlers: map[string]http.Handler{
			"/v1/operator/": s.operatorRoutes(), "/metrics": s.metricsHandler(), join.CAPath: s.caForAgents(caPEM),
			join.ServingCertPath: http.HandlerFunc(s.signAgentServingCert),
			join.ServerCAPath:    onlyMethod(http.MethodGet, s.serverCAHandler), join.ServerJoinPath: onlyMethod(http.MethodPost, s.serverJoinHandler),
			join.GossipKeyringPath: onlyMethod(http.MethodGet, s.agentGossipKeyring),
			version.Path:           onlyMethod(http.MethodGet, serveVersion),
		},
		AgentTransport: agentTransport,
		Metrics:        metrics,
		Audit:          s.auditConfig(),
		RBACPolicyReady: func() {
			s.rbacPolicyOnce.Do(func() { close(s.rbacPolicyReady) })
		},
		ReadyzChecks:      []healthz.HealthChecker{healthz.NamedCheck("skiff-raft", s.raftReady)},
		ServiceCIDR:       s.cfg.ServiceCIDR,
		Transformers:      s.enc,
		ClusterCIDR:       s.cfg.ClusterCIDR,
		LoadBalancerPools: s.cfg.LoadBalancerPools,
		EventTTL:          s.cfg.EventTTL,

		DefaultTolerationSeconds: &s.cfg.DefaultTolerationSeconds,
		PodSecurity:              apiserver.PodSecurityConfig(s.cfg.PodSecurity),

		MaxRequestsInFlight: s.cfg.MaxRequestsInFlight, MaxMutatingRequestsInFlight: s.cfg.MaxMutatingRequestsInFlight,

		FrontProxyCAPEM: frontProxyCAPEM, FrontProxyClientCertFile: frontProxyCert, FrontProxyClientKeyFile: frontProxyKey,
	})
	if err != nil {
		ln.Close()
		s.logger.Error("building the API server", "error", err)
		return
	}
	if err := s.writeAdminCredentials("https://"+s.cfg.AdvertiseAPIAddr(), caPEM, token); err != nil {
		s.logger.Error("writing admin kubeconfig", "error", err)
	} else {
		s.logger.Info("wrote admin kubeconfig", "path", s.KubeconfigPath())
	}
	go s.writeJoinToken(ctx, caPEM)
	go metrics.Run(ctx)
	s.logger.Info("serving the Kubernetes API", "address", s.cfg.AdvertiseAPIAddr())
	if err := api.Run(ctx); err != nil && ctx.Err() == nil {
		s.logger.Error("API server stopped", "error", err)
	}
}

// auditConfig is the API's audit log, or nil when server.audit.path is not set.
func (s *Server) auditConfig() *apiserver.AuditConfig {
	a := s.cfg.Audit
	if a.Path == "" {
		return nil
	}
	return &apiserver.AuditConfig{Path: a.Path, PolicyFile: a.PolicyFile, MaxAge: a.MaxAge, MaxBackups: a.MaxBackups, MaxSize: a.MaxSize}
}

// raftReady is the readiness check of the Raft read path: this peer knows a leader and has applied what it
// committed.
func (s *Server) raftReady(r *http.Request) error {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	return s.node.LinearizableRead(ctx)
}

// adminCertLifetime is how long the admin kubeconfig's certificate lives; every start of the server
// writes a fresh one.
const adminCertLifetime = 365 * 24 * time.Hour

// AdminTokenPath is where, under the data dir, the server writes the admin bearer token, for operators who
// prefer a token to the admin kubeconfig's certificate.
const AdminTokenPath = "admin-token"

// writeAdminCredentials writes admin.kubeconfig, with a client certificate from the cluster CA for
// skiff-admin in system:masters (as kubeadm's admin.conf), and the admin token beside it.
func (s *Server) writeAdminCredentials(server string, caPEM []byte, token string) error {
	_, ca, caKey, err := s.clusterCA()
	if err != nil {
		return err
	}
	certPEM, keyPEM, err := issueClientCertPEM(ca, caKey, pkix.Name{CommonName: adminUser, Organization: []string{user.SystemPrivilegedGroup}}, adminCertLifetime)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(filepath.Join(s.cfg.DataDir, AdminTokenPath), []byte(token+"\n")); err != nil {
		return err
	}
	return WriteKubeconfig(s.KubeconfigPath(), server, caPEM, certPEM, keyPEM)
}

// WriteKubeconfig writes a kubeconfig for a user with a client certificate, atomically and readable by its
// owner only.
func WriteKubeconfig(path, server string, caPEM, certPEM, keyPEM []byte) error {
	b64 := base64.StdEncoding.EncodeToString
	body := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: skiff
  cluster:
    server: %s
    certificate-authority-data: %s
contexts:
- name: skiff
  context:
    cluster: skiff
    user: admin
current-context: skiff
users:
- name: admin
  user:
    client-certificate-data: %s
    client-key-data: %s
`, server, b64(caPEM), b64(certPEM), b64(keyPEM))
	return writeFileAtomic(path, []byte(body))
}

// writeFileAtomic writes a file readable by its owner only, through a rename so readers never see half.
func writeFileAtomic(path string, body []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, body, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Shutdown stops the peer gracefully: a leader hands leadership to another voter, the member leaves gossip,
// the HTTP server drains, and Raft and its stores close. It is safe to call more than once.
func (s *Server) Shutdown() {
	s.stopOnce.Do(func() {
		stopping.Store(true)
		if s.node.IsLeader() {
			if err := s.node.TransferLeadership(""); err != nil {
				s.logger.Warn("leadership transfer before shutdown failed", "error", err)
			}
		}
		if err := s.pool.Leave(2 * time.Second); err != nil {
			s.logger.Warn("leaving gossip", "error", err)
		}
		s.cancel()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s.http.Shutdown(ctx)
		cancel()
		s.pool.Shutdown()
		if err := s.node.Shutdown(); err != nil {
			s.logger.Warn("raft shutdown", "error", err)
		}
		s.wg.Wait()
		close(s.done)
		s.logger.Info("server stopped")
	})
}

// bootID identifies this run of the process in gossip.
func bootID() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}
