package config

import (
	"encoding/binary"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	psaapi "k8s.io/pod-security-admission/api"

	"github.com/skiff-dev/skiff/internal/join"
	"github.com/skiff-dev/skiff/internal/lbpool"
)

// ServerFile is the schema of a server configuration file. Pointers mark optional keys, so that layering
// can tell "not set" from a zero value.
type ServerFile struct {
	Name          *string `hcl:"name,optional"`
	DataDir       *string `hcl:"data_dir,optional"`
	BindAddr      *string `hcl:"bind_addr,optional"`
	AdvertiseAddr *string `hcl:"advertise_addr,optional"`
	LogLevel      *string `hcl:"log_level,optional"`
	LogJSON       *bool   `hcl:"log_json,optional"`
	Encrypt       *string `hcl:"encrypt,optional"`
	// MemoryLimit is the Go runtime's soft memory limit for the server process (a Kubernetes quantity, such as
	// "2Gi"): near it the garbage collector runs more often instead of letting the heap grow to twice what is
	// live. Unset: the GOMEMLIMIT environment variable's, or none.
	MemoryLimit *string      `hcl:"memory_limit,optional"`
	Ports       *PortsBlock  `hcl:"ports,block"`
	Server      *ServerBlock `hcl:"server,block"`
}

// PortsBlock is `ports { ... }`.
type PortsBlock struct {
	API    *int `hcl:"api,optional"`
	Raft   *int `hcl:"raft,optional"`
	Gossip *int `hcl:"gossip,optional"`
}

// ServerBlock is `server { ... }`.
type ServerBlock struct {
	Enabled         *bool    `hcl:"enabled,optional"`
	BootstrapExpect *int     `hcl:"bootstrap_expect,optional"`
	RetryJoin       []string `hcl:"retry_join,optional"`
	RetryInterval   *string  `hcl:"retry_interval,optional"`
	ServiceCIDR     *string  `hcl:"service_cidr,optional"`
	// ClusterDNS is the kube-dns Service's ClusterIP (empty: the tenth address of service_cidr) and
	// ClusterDomain the DNS suffix of Services and pods.
	ClusterDNS    *string `hcl:"cluster_dns,optional"`
	ClusterDomain *string `hcl:"cluster_domain,optional"`
	EventTTL      *string `hcl:"event_ttl,optional"`
	ClusterCIDR   *string `hcl:"cluster_cidr,optional"`
	// Node lifecycle: how long a Lease may go unrenewed, how long pods stay Terminating on a lost node, and
	// the tolerationSeconds every pod gets for the not-ready and unreachable taints.
	NodeLeaseGrace *string `hcl:"node_lease_grace,optional"`
	PodGCTimeout   *string `hcl:"pod_gc_timeout,optional"`
	// ResourceQuotaSyncPeriod is kube-controller-manager's --resource-quota-sync-period: how often the
	// quota controller recomputes every quota's usage, giving back what failed creates charged.
	ResourceQuotaSyncPeriod  *string `hcl:"resource_quota_sync_period,optional"`
	DefaultTolerationSeconds *int    `hcl:"default_toleration_seconds,optional"`
	// NodeCertificateTTL is the longest a certificate signed through the CSR API lives (node client
	// certificates among them), as kube-controller-manager's --cluster-signing-duration.
	NodeCertificateTTL *string `hcl:"node_certificate_ttl,optional"`
	// Autopilot: how long a dead server stays in the Raft configuration, and how long a new server must be
	// healthy before it votes.
	DeadServerCleanup       *string `hcl:"dead_server_cleanup,optional"`
	ServerStabilizationTime *string `hcl:"server_stabilization_time,optional"`
	// Token is the cluster token: servers present it to join (and it keys the default gossip encryption);
	// it is also the first join token of node agents. Required when bootstrap_expect is more than 1.
	Token *string `hcl:"token,optional"`
	// The API answers 429 with Retry-After beyond these many requests in flight, as kube-apiserver does.
	MaxRequestsInFlight         *int              `hcl:"max_requests_in_flight,optional"`
	MaxMutatingRequestsInFlight *int              `hcl:"max_mutating_requests_in_flight,optional"`
	Raft                        *RaftBlock        `hcl:"raft,block"`
	WatchHistory                *HistBlock        `hcl:"watch_history,block"`
	Audit                       *AuditBlock       `hcl:"audit,block"`
	PodSecurity                 *PodSecurityBlock `hcl:"pod_security,block"`
	// LoadBalancer holds the address pools LoadBalancer Services get their addresses from.
	LoadBalancer *LoadBalancerBlock `hcl:"load_balancer,block"`
	// EncryptionConfig is the path of a Kubernetes EncryptionConfiguration file (apiserver.config.k8s.io/v1):
	// the resources it lists are encrypted in the Raft log, the snapshots and `snapshot save` files. Every
	// server must have the same one.
	EncryptionConfig *string `hcl:"encryption_config,optional"`
	// SecretsEncryption, without encryption_config, has the first server draw an EncryptionConfiguration
	// with a fresh key at the cluster's bootstrap (default true).
	SecretsEncryption *bool `hcl:"secrets_encryption,optional"`
	// RoutePodCIDRs has the server route every Node's pod CIDR via the Node's address (default false), so
	// that the API reaches webhooks and extension API servers that run in pods, when the servers share an L2
	// network with the nodes (docs/networking.md).
	RoutePodCIDRs *bool `hcl:"route_pod_cidrs,optional"`
	// ManifestsDir is the folder whose YAML and JSON files the leader applies (default <data_dir>/manifests);
	// every server has its own, and operators keep the same files in each (docs/operations.md).
	ManifestsDir *string `hcl:"manifests_dir,optional"`
}

// PodSecurityBlock is `server { pod_security { ... } }`: Kubernetes' PodSecurity admission defaults (the
// levels of namespaces that carry no pod-security.kubernetes.io labels) and exemptions, as kube-apiserver's
// PodSecurityConfiguration has them.
type PodSecurityBlock struct {
	Enforce              *string  `hcl:"enforce,optional"`
	EnforceVersion       *string  `hcl:"enforce_version,optional"`
	Audit                *string  `hcl:"audit,optional"`
	AuditVersion         *string  `hcl:"audit_version,optional"`
	Warn                 *string  `hcl:"warn,optional"`
	WarnVersion          *string  `hcl:"warn_version,optional"`
	ExemptUsernames      []string `hcl:"exempt_usernames,optional"`
	ExemptNamespaces     []string `hcl:"exempt_namespaces,optional"`
	ExemptRuntimeClasses []string `hcl:"exempt_runtime_classes,optional"`
}

// AuditBlock is `server { audit { ... } }`: the API's audit log, off unless path is set. The sizes are
// kube-apiserver's --audit-log-* flags: days, files, megabytes.
type AuditBlock struct {
	Path       *string `hcl:"path,optional"`
	PolicyFile *string `hcl:"policy_file,optional"`
	MaxAge     *int    `hcl:"max_age,optional"`
	MaxBackups *int    `hcl:"max_backups,optional"`
	MaxSize    *int    `hcl:"max_size,optional"`
}

// RaftBlock is `server { raft { ... } }`.
type RaftBlock struct {
	HeartbeatTimeout   *string `hcl:"heartbeat_timeout,optional"`
	ElectionTimeout    *string `hcl:"election_timeout,optional"`
	LeaderLeaseTimeout *string `hcl:"leader_lease_timeout,optional"`
	SnapshotThreshold  *int    `hcl:"snapshot_threshold,optional"`
	SnapshotInterval   *string `hcl:"snapshot_interval,optional"`
	TrailingLogs       *int    `hcl:"trailing_logs,optional"`
	WriteTimeout       *string `hcl:"write_timeout,optional"`
}

// HistBlock is `server { watch_history { ... } }`.
type HistBlock struct {
	Events *int    `hcl:"events,optional"`
	Age    *string `hcl:"age,optional"`
}

// Server is a resolved, validated server configuration.
type Server struct {
	Name          string
	DataDir       string
	BindAddr      string
	AdvertiseAddr string
	LogLevel      string
	LogJSON       bool
	Encrypt       string // base64 gossip key; empty: the key derived from Token (see gossip.Config)
	MemoryLimit   int64  // bytes; 0: not set (see ServerFile)
	Ports         Ports

	BootstrapExpect int
	RetryJoin       []string // host:port of gossip members
	RetryInterval   time.Duration
	ServiceCIDR     string // ClusterIPs come from here
	ClusterDNS      string // the kube-dns Service's ClusterIP, inside ServiceCIDR
	ClusterDomain   string // cluster.local by default
	ClusterCIDR     string // Nodes' pod CIDRs (a /24 each) come from here
	EventTTL        time.Duration
	// Node lifecycle (see ServerBlock).
	NodeLeaseGrace           time.Duration
	PodGCTimeout             time.Duration
	ResourceQuotaSyncPeriod  time.Duration
	DefaultTolerationSeconds int64
	NodeCertificateTTL       time.Duration // see ServerBlock
	DeadServerCleanup        time.Duration // see ServerBlock
	ServerStabilizationTime  time.Duration
	// Token is the cluster token (see ServerBlock); its zero value means unset, and a single server then
	// draws one at its first start (see server.clusterToken).
	Token join.Token

	MaxRequestsInFlight         int
	MaxMutatingRequestsInFlight int

	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	SnapshotThreshold  uint64
	SnapshotInterval   time.Duration
	TrailingLogs       uint64
	WriteTimeout       time.Duration

	HistoryEvents int
	HistoryAge    time.Duration

	// Audit is the audit log; its Path is empty when auditing is off.
	Audit Audit
	// PodSecurity is the PodSecurity admission's defaults and exemptions.
	PodSecurity PodSecurity
	// EncryptionConfig is the operator's EncryptionConfiguration file; empty: Skiff's own, when
	// SecretsEncryption is set.
	EncryptionConfig  string
	SecretsEncryption bool
	// RoutePodCIDRs: the server routes every Node's pod CIDR via the Node's InternalIP.
	RoutePodCIDRs bool
	// ManifestsDir is the auto-applied manifests folder (see ServerBlock).
	ManifestsDir string
	// LoadBalancerPools are the load balancer address pools (see LoadBalancerBlock); none: Skiff hands out
	// no load balancer addresses.
	LoadBalancerPools lbpool.Pools
}

// LoadBalancerBlock is `server { load_balancer { ... } }`: where LoadBalancer Services (of no
// loadBalancerClass) get their addresses. Entries are CIDRs ("10.10.0.0/28", without its network and
// broadcast addresses), ranges ("10.10.0.5-10.10.0.9") or single addresses. Every server must have the same.
type LoadBalancerBlock struct {
	// Pool is the default pool, for Services that name none.
	Pool []string `hcl:"pool,optional"`
	// Pools are named pools, which a Service asks for with the skiff.dev/load-balancer-pool annotation.
	Pools map[string][]string `hcl:"pools,optional"`
}

// PodSecurity holds the PodSecurity admission's default levels and versions (for namespaces without labels)
// and its exemptions.
type PodSecurity struct {
	Enforce, EnforceVersion, Audit, AuditVersion, Warn, WarnVersion string
	ExemptUsernames, ExemptNamespaces, ExemptRuntimeClasses         []string
}

// Audit configures the API's audit log: Kubernetes' audit policy file and a rotated JSON-lines log.
type Audit struct {
	Path, PolicyFile            string
	MaxAge, MaxBackups, MaxSize int // days, files, megabytes; 0 keeps everything
}

// Ports are the listeners of a server.
type Ports struct{ API, Raft, Gossip int }

// Address helpers: every listener binds BindAddr; peers dial AdvertiseAddr.
func (s *Server) APIAddr() string  { return net.JoinHostPort(s.BindAddr, strconv.Itoa(s.Ports.API)) }
func (s *Server) RaftAddr() string { return net.JoinHostPort(s.BindAddr, strconv.Itoa(s.Ports.Raft)) }
func (s *Server) AdvertiseAPIAddr() string {
	return net.JoinHostPort(s.AdvertiseAddr, strconv.Itoa(s.Ports.API))
}
func (s *Server) AdvertiseRaftAddr() string {
	return net.JoinHostPort(s.AdvertiseAddr, strconv.Itoa(s.Ports.Raft))
}

// DefaultServerFile holds the defaults, in file form so that the file and flags layer over them.
func DefaultServerFile() *ServerFile {
	host, _ := os.Hostname()
	return &ServerFile{
		Name:     ptr(host),
		BindAddr: ptr("127.0.0.1"),
		LogLevel: ptr("info"),
		LogJSON:  ptr(false),
		Ports:    &PortsBlock{API: ptr(6443), Raft: ptr(6444), Gossip: ptr(7946)},
		Server: &ServerBlock{
			Enabled: ptr(true), BootstrapExpect: ptr(1), RetryInterval: ptr("2s"), ServiceCIDR: ptr("10.96.0.0/16"), ClusterDomain: ptr("cluster.local"), ClusterCIDR: ptr("10.244.0.0/16"), EventTTL: ptr("1h"),
			NodeLeaseGrace: ptr("40s"), PodGCTimeout: ptr("10m"), ResourceQuotaSyncPeriod: ptr("5m"), DefaultTolerationSeconds: ptr(300), NodeCertificateTTL: ptr("8760h"),
			DeadServerCleanup: ptr("5m"), ServerStabilizationTime: ptr("10s"), SecretsEncryption: ptr(true), RoutePodCIDRs: ptr(false),
			MaxRequestsInFlight: ptr(400), MaxMutatingRequestsInFlight: ptr(200),
			Raft: &RaftBlock{
				HeartbeatTimeout: ptr("500ms"), ElectionTimeout: ptr("500ms"), LeaderLeaseTimeout: ptr("250ms"),
				SnapshotThreshold: ptr(8192), SnapshotInterval: ptr("30s"), TrailingLogs: ptr(10240),
				WriteTimeout: ptr("10s"),
			},
			WatchHistory: &HistBlock{Events: ptr(100000), Age: ptr("5m")},
			Audit:        &AuditBlock{Path: ptr(""), PolicyFile: ptr(""), MaxAge: ptr(0), MaxBackups: ptr(0), MaxSize: ptr(0)},
			PodSecurity: &PodSecurityBlock{Enforce: ptr("privileged"), EnforceVersion: ptr("latest"), Audit: ptr("privileged"),
				AuditVersion: ptr("latest"), Warn: ptr("privileged"), WarnVersion: ptr("latest")},
		},
	}
}

func ptr[T any](v T) *T { return &v }

// LoadServer reads the file at path (if not empty), layers it over the defaults and flags over it, then
// resolves and validates the result.
func LoadServer(path string, flags *ServerFile) (*Server, error) {
	merged, src, err := layer(path, DefaultServerFile(), flags)
	if err != nil {
		return nil, err
	}
	return resolveServer(merged, src)
}

func resolveServer(f *ServerFile, src *source) (*Server, error) {
	var errs Errors
	s := &Server{
		Name: *f.Name, BindAddr: *f.BindAddr, LogLevel: *f.LogLevel, LogJSON: *f.LogJSON,
		Ports:             Ports{API: *f.Ports.API, Raft: *f.Ports.Raft, Gossip: *f.Ports.Gossip},
		BootstrapExpect:   *f.Server.BootstrapExpect,
		SnapshotThreshold: uint64(max(0, *f.Server.Raft.SnapshotThreshold)),
		TrailingLogs:      uint64(max(0, *f.Server.Raft.TrailingLogs)),
		HistoryEvents:     *f.Server.WatchHistory.Events,
		Audit: Audit{Path: *f.Server.Audit.Path, PolicyFile: *f.Server.Audit.PolicyFile,
			MaxAge: *f.Server.Audit.MaxAge, MaxBackups: *f.Server.Audit.MaxBackups, MaxSize: *f.Server.Audit.MaxSize},
		PodSecurity: PodSecurity{Enforce: *f.Server.PodSecurity.Enforce, EnforceVersion: *f.Server.PodSecurity.EnforceVersion,
			Audit: *f.Server.PodSecurity.Audit, AuditVersion: *f.Server.PodSecurity.AuditVersion,
			Warn: *f.Server.PodSecurity.Warn, WarnVersion: *f.Server.PodSecurity.WarnVersion,
			ExemptUsernames: f.Server.PodSecurity.ExemptUsernames, ExemptNamespaces: f.Server.PodSecurity.ExemptNamespaces,
			ExemptRuntimeClasses: f.Server.PodSecurity.ExemptRuntimeClasses},

		SecretsEncryption:           *f.Server.SecretsEncryption,
		RoutePodCIDRs:               *f.Server.RoutePodCIDRs,
		MaxRequestsInFlight:         *f.Server.MaxRequestsInFlight,
		MaxMutatingRequestsInFlight: *f.Server.MaxMutatingRequestsInFlight,
	}
	if f.DataDir != nil {
		s.DataDir = *f.DataDir
	}
	if f.Server.EncryptionConfig != nil && *f.Server.EncryptionConfig != "" {
		s.EncryptionConfig = *f.Server.EncryptionConfig
		if _, err := os.Stat(s.EncryptionConfig); err != nil {
			errs.add(src, "server.encryption_config", err.Error())
		}
	}
	if f.AdvertiseAddr != nil {
		s.AdvertiseAddr = *f.AdvertiseAddr
	}
	if f.Server.Token != nil {
		tok, err := join.ParseToken(*f.Server.Token)
		if err != nil {
			errs.add(src, "server.token", err.Error())
		}
		s.Token = tok
	} else if s.BootstrapExpect > 1 {
		errs.add(src, "server.token", fmt.Sprintf("is required with bootstrap_expect = %d: the servers authenticate each other with it; give every server the same one (for example `openssl rand -hex 16`)", s.BootstrapExpect))
	}
	if f.Encrypt != nil {
		s.Encrypt = errs.gossipKey(src, "encrypt", *f.Encrypt)
	}
	if s.Name == "" {
		errs.add(src, "name", "must not be empty")
	}
	if s.DataDir == "" {
		s.DataDir = filepath.Join("/var/lib/skiff", s.Name)
	}
	if s.ManifestsDir = filepath.Join(s.DataDir, "manifests"); f.Server.ManifestsDir != nil {
		if s.ManifestsDir = *f.Server.ManifestsDir; s.ManifestsDir == "" {
			errs.add(src, "server.manifests_dir", "must not be empty; leave it out for <data_dir>/manifests")
		}
	}
	if ip := net.ParseIP(s.BindAddr); ip == nil {
		errs.add(src, "bind_addr", fmt.Sprintf("%q is not an IP address", s.BindAddr))
	}
	if s.AdvertiseAddr == "" {
		s.AdvertiseAddr = s.BindAddr
	}
	if ip := net.ParseIP(s.AdvertiseAddr); ip == nil || ip.IsUnspecified() {
		errs.add(src, "advertise_addr", fmt.Sprintf("%q is not a routable IP address; set advertise_addr when bind_addr is 0.0.0.0", s.AdvertiseAddr))
	}
	if !validLogLevel(s.LogLevel) {
		errs.add(src, "log_level", fmt.Sprintf("%q is not one of trace, debug, info, warn, error", s.LogLevel))
	}
	if f.MemoryLimit != nil {
		s.MemoryLimit = errs.memoryLimit(src, "memory_limit", *f.MemoryLimit)
	}
	seen := map[int]string{}
	for _, p := range []struct {
		key  string
		port int
	}{{"api", s.Ports.API}, {"raft", s.Ports.Raft}, {"gossip", s.Ports.Gossip}} {
		if p.port < 1 || p.port > 65535 {
			errs.add(src, "ports."+p.key, fmt.Sprintf("port %d is out of range 1-65535", p.port))
		} else if other, dup := seen[p.port]; dup {
			errs.add(src, "ports."+p.key, fmt.Sprintf("port %d is already used by ports.%s", p.port, other))
		}
		seen[p.port] = p.key
	}
	s.ServiceCIDR = *f.Server.ServiceCIDR
	if ip, cidr, err := net.ParseCIDR(s.ServiceCIDR); err != nil || ip.To4() == nil {
		errs.add(src, "server.service_cidr", fmt.Sprintf("%q is not an IPv4 CIDR such as \"10.96.0.0/16\"", s.ServiceCIDR))
	} else if ones, _ := cidr.Mask.Size(); ones > 28 {
		errs.add(src, "server.service_cidr", fmt.Sprintf("%q is too small; use a prefix of /28 or shorter", s.ServiceCIDR))
	}
	s.ClusterDNS, s.ClusterDomain = resolveClusterDNS(f.Server, src, &errs)
	s.ClusterCIDR = *f.Server.ClusterCIDR
	if ip, cidr, err := net.ParseCIDR(s.ClusterCIDR); err != nil || ip.To4() == nil {
		errs.add(src, "server.cluster_cidr", fmt.Sprintf("%q is not an IPv4 CIDR such as \"10.244.0.0/16\"", s.ClusterCIDR))
	} else if ones, _ := cidr.Mask.Size(); ones > 24 {
		errs.add(src, "server.cluster_cidr", fmt.Sprintf("%q is too small for one /24 per node; use a prefix of /24 or shorter", s.ClusterCIDR))
	}
	if s.BootstrapExpect < 1 {
		errs.add(src, "server.bootstrap_expect", fmt.Sprintf("must be at least 1, got %d", s.BootstrapExpect))
	}
	if f.Server.Enabled != nil && !*f.Server.Enabled {
		errs.add(src, "server.enabled", "must be true for `skiff server`")
	}
	for i, j := range f.Server.RetryJoin {
		addr, err := withDefaultPort(j, s.Ports.Gossip)
		if err != nil {
			errs.add(src, "server.retry_join", fmt.Sprintf("entry %d: %v", i, err))
			continue
		}
		s.RetryJoin = append(s.RetryJoin, addr)
	}
	for _, d := range []struct {
		key string
		val *string
		out *time.Duration
	}{
		{"server.retry_interval", f.Server.RetryInterval, &s.RetryInterval},
		{"server.event_ttl", f.Server.EventTTL, &s.EventTTL},
		{"server.node_lease_grace", f.Server.NodeLeaseGrace, &s.NodeLeaseGrace},
		{"server.pod_gc_timeout", f.Server.PodGCTimeout, &s.PodGCTimeout},
		{"server.resource_quota_sync_period", f.Server.ResourceQuotaSyncPeriod, &s.ResourceQuotaSyncPeriod},
		{"server.node_certificate_ttl", f.Server.NodeCertificateTTL, &s.NodeCertificateTTL},
		{"server.dead_server_cleanup", f.Server.DeadServerCleanup, &s.DeadServerCleanup},
		{"server.server_stabilization_time", f.Server.ServerStabilizationTime, &s.ServerStabilizationTime},
		{"server.raft.heartbeat_timeout", f.Server.Raft.HeartbeatTimeout, &s.HeartbeatTimeout},
		{"server.raft.election_timeout", f.Server.Raft.ElectionTimeout, &s.ElectionTimeout},
		{"server.raft.leader_lease_timeout", f.Server.Raft.LeaderLeaseTimeout, &s.LeaderLeaseTimeout},
		{"server.raft.snapshot_interval", f.Server.Raft.SnapshotInterval, &s.SnapshotInterval},
		{"server.raft.write_timeout", f.Server.Raft.WriteTimeout, &s.WriteTimeout},
		{"server.watch_history.age", f.Server.WatchHistory.Age, &s.HistoryAge},
	} {
		*d.out = errs.duration(src, d.key, *d.val)
	}
	if s.NodeCertificateTTL > 0 && s.NodeCertificateTTL < time.Minute {
		errs.add(src, "server.node_certificate_ttl", fmt.Sprintf("%q is too short: a certificate must live at least 1m, to be renewed before it expires", *f.Server.NodeCertificateTTL))
	}
	for _, ps := range []struct{ key, level, version string }{
		{"enforce", s.PodSecurity.Enforce, s.PodSecurity.EnforceVersion}, {"audit", s.PodSecurity.Audit, s.PodSecurity.AuditVersion},
		{"warn", s.PodSecurity.Warn, s.PodSecurity.WarnVersion},
	} {
		if _, err := psaapi.ParseLevel(ps.level); err != nil {
			errs.add(src, "server.pod_security."+ps.key, err.Error())
		}
		if _, err := psaapi.ParseVersion(ps.version); err != nil {
			errs.add(src, "server.pod_security."+ps.key+"_version", err.Error())
		}
	}
	s.LoadBalancerPools = resolveLoadBalancerPools(f.Server.LoadBalancer,
		map[string]string{"server.service_cidr": s.ServiceCIDR, "server.cluster_cidr": s.ClusterCIDR}, src, &errs)
	if s.Audit.Path != "" && s.Audit.PolicyFile == "" {
		errs.add(src, "server.audit.policy_file", "is required with server.audit.path: Kubernetes' audit policy says what to record")
	} else if s.Audit.Path != "" {
		if _, err := os.Stat(s.Audit.PolicyFile); err != nil {
			errs.add(src, "server.audit.policy_file", err.Error())
		}
	}
	for _, n := range []struct {
		key string
		v   int
	}{{"server.audit.max_age", s.Audit.MaxAge}, {"server.audit.max_backups", s.Audit.MaxBackups}, {"server.audit.max_size", s.Audit.MaxSize}} {
		if n.v < 0 {
			errs.add(src, n.key, fmt.Sprintf("must be 0 or more, got %d", n.v))
		}
	}
	if s.DefaultTolerationSeconds = int64(*f.Server.DefaultTolerationSeconds); s.DefaultTolerationSeconds < 0 {
		errs.add(src, "server.default_toleration_seconds", fmt.Sprintf("must be 0 or more, got %d", s.DefaultTolerationSeconds))
	}
	if s.LeaderLeaseTimeout > s.HeartbeatTimeout {
		errs.add(src, "server.raft.leader_lease_timeout", "must not exceed heartbeat_timeout")
	}
	for _, n := range []struct {
		key string
		v   int
	}{{"server.raft.snapshot_threshold", *f.Server.Raft.SnapshotThreshold}, {"server.raft.trailing_logs", *f.Server.Raft.TrailingLogs}, {"server.watch_history.events", s.HistoryEvents},
		{"server.max_requests_in_flight", s.MaxRequestsInFlight}, {"server.max_mutating_requests_in_flight", s.MaxMutatingRequestsInFlight}} {
		if n.v < 1 {
			errs.add(src, n.key, fmt.Sprintf("must be at least 1, got %d", n.v))
		}
	}
	if err := errs.err(); err != nil {
		return nil, err
	}
	return s, nil
}

func validLogLevel(l string) bool {
	switch strings.ToLower(l) {
	case "trace", "debug", "info", "warn", "error":
		return true
	}
	return false
}

// withDefaultPort accepts "host" or "host:port".
func withDefaultPort(addr string, port int) (string, error) {
	if host, p, err := net.SplitHostPort(addr); err == nil {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 || host == "" {
			return "", fmt.Errorf("%q is not host or host:port (port 1-65535)", addr)
		}
		return addr, nil
	}
	if strings.Contains(addr, ":") && net.ParseIP(addr) == nil {
		return "", fmt.Errorf("%q is not host or host:port", addr)
	}
	if addr == "" {
		return "", fmt.Errorf("empty address")
	}
	return net.JoinHostPort(addr, strconv.Itoa(port)), nil
}

// resolveClusterDNS checks cluster_dns (an address of service_cidr other than its first, which the kubernetes
// Service holds; the tenth address when unset, as kubeadm picks) and cluster_domain (a DNS name).
// resolveLoadBalancerPools checks the pools: each entry an address, range or CIDR, in no other entry and in
// none of the CIDRs taken (by their keys: the service and cluster CIDRs); the default pool comes first.
func resolveLoadBalancerPools(b *LoadBalancerBlock, taken map[string]string, src *source, errs *Errors) lbpool.Pools {
	if b == nil {
		return nil
	}
	type entry struct {
		key, what string
		r         lbpool.Range
	}
	var seen []entry
	for _, key := range slices.Sorted(maps.Keys(taken)) {
		if p, err := netip.ParsePrefix(taken[key]); err == nil {
			seen = append(seen, entry{key, key + " " + taken[key], lbpool.Network(p)})
		}
	}
	// pool checks one pool's entries; errors name the key, and the pool and entry in the message.
	pool := func(name, key, what string, values []string) lbpool.Pool {
		p := lbpool.Pool{Name: name}
		for i, v := range values {
			at := fmt.Sprintf("%sentry %d", what, i)
			r, err := lbpool.ParseRange(v)
			if err != nil {
				errs.add(src, key, fmt.Sprintf("%s: %v", at, err))
				continue
			}
			for _, e := range seen {
				if e.r.Overlaps(r) {
					errs.add(src, key, fmt.Sprintf("%s: %s overlaps %s", at, r, e.what))
				}
			}
			seen = append(seen, entry{key, fmt.Sprintf("%s of %s", at, key), r})
			p.Ranges = append(p.Ranges, r)
		}
		return p
	}
	var pools lbpool.Pools
	if len(b.Pool) > 0 {
		pools = append(pools, pool(lbpool.DefaultPool, "server.load_balancer.pool", "", b.Pool))
	}
	const key = "server.load_balancer.pools"
	for _, name := range slices.Sorted(maps.Keys(b.Pools)) {
		switch msgs := validation.IsDNS1123Label(name); {
		case name == lbpool.DefaultPool:
			errs.add(src, key, fmt.Sprintf("%q: the default pool is server.load_balancer.pool", name))
		case len(msgs) > 0:
			errs.add(src, key, fmt.Sprintf("%q is not a valid pool name: %s", name, strings.Join(msgs, "; ")))
		case len(b.Pools[name]) == 0:
			errs.add(src, key, fmt.Sprintf("pool %q is empty", name))
		default:
			pools = append(pools, pool(name, key, fmt.Sprintf("pool %q, ", name), b.Pools[name]))
		}
	}
	return pools
}

func resolveClusterDNS(b *ServerBlock, src *source, errs *Errors) (dnsIP, domain string) {
	domain = strings.TrimSuffix(*b.ClusterDomain, ".")
	if msgs := validation.IsDNS1123Subdomain(domain); len(msgs) > 0 {
		errs.add(src, "server.cluster_domain", fmt.Sprintf("%q is not a DNS name: %s", *b.ClusterDomain, strings.Join(msgs, "; ")))
	}
	_, cidr, err := net.ParseCIDR(*b.ServiceCIDR)
	if err != nil || cidr.IP.To4() == nil {
		return "", domain // service_cidr's own error says it
	}
	base := binary.BigEndian.Uint32(cidr.IP.To4())
	if b.ClusterDNS == nil || *b.ClusterDNS == "" {
		ip := make(net.IP, 4)
		binary.BigEndian.PutUint32(ip, base+10)
		return ip.String(), domain
	}
	ip := net.ParseIP(*b.ClusterDNS).To4()
	switch {
	case ip == nil:
		errs.add(src, "server.cluster_dns", fmt.Sprintf("%q is not an IPv4 address", *b.ClusterDNS))
	case !cidr.Contains(ip):
		errs.add(src, "server.cluster_dns", fmt.Sprintf("%s is not in service_cidr %s", ip, cidr))
	case binary.BigEndian.Uint32(ip) == base || binary.BigEndian.Uint32(ip) == base+1:
		errs.add(src, "server.cluster_dns", fmt.Sprintf("%s is the network address or the kubernetes Service's; pick another address of %s", ip, cidr))
	default:
		return ip.String(), domain
	}
	return "", domain
}
