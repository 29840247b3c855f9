package config

import (
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2/hclsyntax"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/skiff-dev/skiff/internal/join"
)

// AgentFile is the schema of a node agent's configuration file.
type AgentFile struct {
	Name          *string     `hcl:"name,optional"`
	DataDir       *string     `hcl:"data_dir,optional"`
	BindAddr      *string     `hcl:"bind_addr,optional"`
	AdvertiseAddr *string     `hcl:"advertise_addr,optional"`
	LogLevel      *string     `hcl:"log_level,optional"`
	LogJSON       *bool       `hcl:"log_json,optional"`
	Encrypt       *string     `hcl:"encrypt,optional"`
	Ports         *AgentPorts `hcl:"ports,block"`
	Agent         *AgentBlock `hcl:"agent,block"`
}

// AgentPorts is an agent's `ports { gossip = N }`.
type AgentPorts struct {
	Gossip *int `hcl:"gossip,optional"`
	// Agent is the HTTPS port the servers reach the agent on for logs, exec, attach, port-forward and metrics
	// (the kubelet's 10250).
	Agent *int `hcl:"agent,optional"`
}

// AgentBlock is `agent { ... }`.
type AgentBlock struct {
	Enabled          *bool             `hcl:"enabled,optional"`
	RetryJoin        []string          `hcl:"retry_join,optional"`
	RetryInterval    *string           `hcl:"retry_interval,optional"`
	RetryMax         *int              `hcl:"retry_max,optional"`
	Servers          []string          `hcl:"servers,optional"`
	Token            *string           `hcl:"token,optional"`
	CAFile           *string           `hcl:"ca_file,optional"`
	ContainerdSocket *string           `hcl:"containerd_socket,optional"`
	PauseImage       *string           `hcl:"pause_image,optional"`
	PodCIDR          *string           `hcl:"pod_cidr,optional"`
	NodeLabels       map[string]string `hcl:"node_labels,optional"`
	NodeTaints       []string          `hcl:"node_taints,optional"`
	MaxPods          *int              `hcl:"max_pods,optional"`
	Runtime          *string           `hcl:"runtime,optional"`
	Registries       []RegistryBlock   `hcl:"registry,block"`
	Simulated        *SimulatedBlock   `hcl:"simulated,block"`
	Proxy            *ProxyBlock       `hcl:"proxy,block"`
	NetworkPolicy    *NetPolBlock      `hcl:"network_policy,block"`
	DNS              *DNSBlock         `hcl:"dns,block"`
	// Container logs rotate when a file reaches container_log_max_size; container_log_max_files are kept
	// per container, the current one included (the kubelet's containerLogMaxSize and containerLogMaxFiles).
	ContainerLogMaxSize  *string `hcl:"container_log_max_size,optional"`
	ContainerLogMaxFiles *int    `hcl:"container_log_max_files,optional"`
}

// DNSBlock is `agent { dns { ... } }`: the agent's embedded CoreDNS (containerd runtime only).
type DNSBlock struct {
	Enabled *bool `hcl:"enabled,optional"`
	// Corefile replaces the built-in Corefile; it is a Go template (see AgentDNS.Corefile).
	Corefile *string `hcl:"corefile,optional"`
}

// RegistryBlock is `agent { registry "host:port" { ... } }`, like containerd's hosts.toml.
type RegistryBlock struct {
	Host               string   `hcl:"host,label"`
	Endpoints          []string `hcl:"endpoints,optional"`
	PlainHTTP          *bool    `hcl:"plain_http,optional"`
	InsecureSkipVerify *bool    `hcl:"insecure_skip_verify,optional"`
	Username           *string  `hcl:"username,optional"`
	Password           *string  `hcl:"password,optional"`
}

// SimulatedBlock is `agent { simulated { ... } }`: one agent process hosting many nodes without containers.
type SimulatedBlock struct {
	Nodes  *int              `hcl:"nodes,optional"`
	CPU    *string           `hcl:"cpu,optional"`
	Memory *string           `hcl:"memory,optional"`
	Pods   *int              `hcl:"pods,optional"`
	Labels map[string]string `hcl:"labels,optional"`
	Zones  *int              `hcl:"zones,optional"`
	// Kubeconfig is the credential of an agent that simulates more than one node: one node's identity may
	// write only its own Node (the Node authorizer and NodeRestriction), so such an agent acts as the
	// kubeconfig's user instead.
	Kubeconfig *string `hcl:"kubeconfig,optional"`
}

// ProxyBlock is `agent { proxy { ... } }`: the iptables service proxy.
type ProxyBlock struct {
	Enabled          *bool   `hcl:"enabled,optional"`
	MinSyncInterval  *string `hcl:"min_sync_interval,optional"`
	FullSyncInterval *string `hcl:"full_sync_interval,optional"`
}

// NetPolBlock is `agent { network_policy { ... } }`: NetworkPolicy enforcement in iptables and ipset.
type NetPolBlock struct {
	Enabled *bool `hcl:"enabled,optional"`
}

// The runtimes an agent can run pods with.
const (
	RuntimeContainerd = "containerd"
	RuntimeSimulated  = "simulated"
)

// Agent is a resolved, validated agent configuration.
type Agent struct {
	Name, DataDir, BindAddr, AdvertiseAddr, LogLevel string
	LogJSON                                          bool

	// Gossip: the pool the agent joins (empty RetryJoin: none, and the Node is judged by its Lease).
	RetryJoin     []string // host:port of gossip members
	RetryInterval time.Duration
	RetryMax      int // join attempts before giving up; 0 means forever
	GossipPort    int
	// AgentPort is the agent's HTTPS endpoint for the servers (logs, exec, attach, port-forward, metrics).
	AgentPort int
	Encrypt   string // base64 gossip key; empty: the key derived from Token (see gossip.Config)

	Servers          []string // host:port of server API addresses; with RetryJoin, learned from the pool when empty
	Token            string
	CAFile           string
	ContainerdSocket string
	// PauseImage is the sandbox image; empty means the one the agent builds from the skiff-pause binary.
	PauseImage string
	PodCIDR    string
	NodeLabels map[string]string
	NodeTaints []corev1.Taint
	MaxPods    int
	Runtime    string
	Registries []Registry
	Simulated  Simulated
	Proxy      Proxy
	// NetworkPolicy enables NetworkPolicy enforcement (containerd runtime only).
	NetworkPolicy bool
	DNS           AgentDNS
	// ContainerLogMaxSize is the size at which a container's log file rotates; ContainerLogMaxFiles how
	// many files a container keeps, the current one included.
	ContainerLogMaxSize  int64
	ContainerLogMaxFiles int
}

// AgentDNS configures the cluster DNS the agent serves to its pods (containerd runtime only).
type AgentDNS struct {
	Enabled bool
	// Corefile overrides the built-in Corefile when not empty. It is a Go text/template with the fields
	// {{.ClusterDomain}}, {{.Bind}}, {{.Port}}, {{.Kubeconfig}}, {{.HealthAddr}}, {{.MetricsAddr}} and
	// {{.Upstream}}; the agent checks it at start (package nodeagent/dns) and reports errors at
	// CorefileFile:CorefileLine, the file line of the Corefile's first line, plus the Corefile's line.
	Corefile     string
	CorefileFile string
	CorefileLine int
}

// Proxy configures the service proxy (containerd runtime only).
type Proxy struct {
	Enabled bool
	// MinSyncInterval batches the changes of that long into one iptables transaction.
	MinSyncInterval time.Duration
	// FullSyncInterval is how often the rules are rewritten without any change, to repair them.
	FullSyncInterval time.Duration
}

// Registry is the resolved configuration of one registry host.
type Registry struct {
	Host                          string
	Endpoints                     []string
	PlainHTTP, InsecureSkipVerify bool
	Username, Password            string
}

// Simulated describes the nodes of a simulated agent.
type Simulated struct {
	Nodes       int
	CPU, Memory resource.Quantity
	Pods        int
	Labels      map[string]string // "%d" in a value is the node index modulo Zones
	Zones       int
	Kubeconfig  string // required when Nodes > 1
}

// DefaultAgentFile holds the agent defaults.
func DefaultAgentFile() *AgentFile {
	host, _ := os.Hostname()
	return &AgentFile{
		Name: ptr(host), BindAddr: ptr("127.0.0.1"), LogLevel: ptr("info"), LogJSON: ptr(false),
		Ports: &AgentPorts{Gossip: ptr(7946), Agent: ptr(10250)},
		Agent: &AgentBlock{
			Enabled: ptr(true), MaxPods: ptr(110), Runtime: ptr(RuntimeContainerd), RetryInterval: ptr("15s"), RetryMax: ptr(0),
			Simulated:           &SimulatedBlock{Nodes: ptr(1), CPU: ptr("4"), Memory: ptr("8Gi"), Pods: ptr(110), Zones: ptr(1)},
			Proxy:               &ProxyBlock{Enabled: ptr(true), MinSyncInterval: ptr("1s"), FullSyncInterval: ptr("30s")},
			NetworkPolicy:       &NetPolBlock{Enabled: ptr(true)},
			DNS:                 &DNSBlock{Enabled: ptr(true)},
			ContainerLogMaxSize: ptr("10Mi"), ContainerLogMaxFiles: ptr(5),
		},
	}
}

// LoadAgent reads the file at path (if not empty), layers it over the defaults and flags over it, then
// resolves and validates the result.
func LoadAgent(path string, flags *AgentFile) (*Agent, error) {
	merged, src, err := layer(path, DefaultAgentFile(), flags)
	if err != nil {
		return nil, err
	}
	return resolveAgent(merged, src)
}

func resolveAgent(f *AgentFile, src *source) (*Agent, error) {
	var errs Errors
	b := f.Agent
	a := &Agent{
		Name: *f.Name, BindAddr: *f.BindAddr, LogLevel: *f.LogLevel, LogJSON: *f.LogJSON,
		MaxPods: *b.MaxPods, Runtime: *b.Runtime, NodeLabels: b.NodeLabels,
	}
	for _, opt := range []struct {
		from *string
		to   *string
	}{{f.DataDir, &a.DataDir}, {f.AdvertiseAddr, &a.AdvertiseAddr}, {b.Token, &a.Token}, {b.CAFile, &a.CAFile},
		{b.ContainerdSocket, &a.ContainerdSocket}, {b.PodCIDR, &a.PodCIDR}, {b.PauseImage, &a.PauseImage}} {
		if opt.from != nil {
			*opt.to = *opt.from
		}
	}
	if a.AdvertiseAddr == "" {
		a.AdvertiseAddr = a.BindAddr
	}
	if errsName := validation.IsDNS1123Subdomain(a.Name); len(errsName) > 0 {
		errs.add(src, "name", fmt.Sprintf("%q is not a valid node name: %s", a.Name, strings.Join(errsName, "; ")))
	}
	if a.DataDir == "" {
		errs.add(src, "data_dir", "is required")
	}
	if !validLogLevel(a.LogLevel) {
		errs.add(src, "log_level", fmt.Sprintf("%q is not one of trace, debug, info, warn, error", a.LogLevel))
	}
	if net.ParseIP(a.BindAddr) == nil {
		errs.add(src, "bind_addr", fmt.Sprintf("%q is not an IP address", a.BindAddr))
	}
	if b.Enabled != nil && !*b.Enabled {
		errs.add(src, "agent.enabled", "must be true for `skiff agent`")
	}
	a.GossipPort, a.RetryMax = *f.Ports.Gossip, *b.RetryMax
	a.RetryInterval = errs.duration(src, "agent.retry_interval", *b.RetryInterval)
	a.AgentPort = *f.Ports.Agent
	for _, p := range []struct {
		key  string
		port int
	}{{"ports.gossip", a.GossipPort}, {"ports.agent", a.AgentPort}} {
		if p.port < 1 || p.port > 65535 {
			errs.add(src, p.key, fmt.Sprintf("%d is not a port", p.port))
		}
	}
	if size, err := resource.ParseQuantity(*b.ContainerLogMaxSize); err != nil || size.Value() < 1<<10 {
		errs.add(src, "agent.container_log_max_size", fmt.Sprintf("%q is not a size of at least 1Ki, such as \"10Mi\"", *b.ContainerLogMaxSize))
	} else {
		a.ContainerLogMaxSize = size.Value()
	}
	if a.ContainerLogMaxFiles = *b.ContainerLogMaxFiles; a.ContainerLogMaxFiles < 2 {
		errs.add(src, "agent.container_log_max_files", fmt.Sprintf("must be at least 2 (the current file and one rotated), got %d", a.ContainerLogMaxFiles))
	}
	if a.RetryMax < 0 {
		errs.add(src, "agent.retry_max", fmt.Sprintf("must be 0 (forever) or more, got %d", a.RetryMax))
	}
	for i, j := range b.RetryJoin {
		addr, err := withDefaultPort(j, a.GossipPort)
		if err != nil {
			errs.add(src, "agent.retry_join", fmt.Sprintf("entry %d: %v", i, err))
			continue
		}
		a.RetryJoin = append(a.RetryJoin, addr)
	}
	if f.Encrypt != nil {
		a.Encrypt = errs.gossipKey(src, "encrypt", *f.Encrypt)
	}
	if len(b.Servers) == 0 && len(b.RetryJoin) == 0 {
		errs.add(src, "agent.servers", "lists no server; give the API address (host:port) of at least one, or retry_join to learn them by gossip")
	}
	for i, s := range b.Servers {
		addr, err := withDefaultPort(s, 6443)
		if err != nil {
			errs.add(src, "agent.servers", fmt.Sprintf("entry %d: %v", i, err))
			continue
		}
		a.Servers = append(a.Servers, addr)
	}
	if a.Token == "" {
		errs.add(src, "agent.token", "is required: the cluster join token (a server's <data_dir>/join-token)")
	} else if _, err := join.ParseToken(a.Token); err != nil {
		errs.add(src, "agent.token", err.Error())
	}
	if a.PodCIDR != "" {
		if ip, _, err := net.ParseCIDR(a.PodCIDR); err != nil || ip.To4() == nil {
			errs.add(src, "agent.pod_cidr", fmt.Sprintf("%q is not an IPv4 CIDR such as \"10.244.7.0/24\"", a.PodCIDR))
		}
	}
	if a.MaxPods < 1 {
		errs.add(src, "agent.max_pods", fmt.Sprintf("must be at least 1, got %d", a.MaxPods))
	}
	for _, key := range slices.Sorted(maps.Keys(a.NodeLabels)) { // errors in a stable order
		value := a.NodeLabels[key]
		if msgs := validation.IsQualifiedName(key); len(msgs) > 0 {
			errs.add(src, "agent.node_labels", fmt.Sprintf("label key %q: %s", key, strings.Join(msgs, "; ")))
		}
		if msgs := validation.IsValidLabelValue(value); len(msgs) > 0 {
			errs.add(src, "agent.node_labels", fmt.Sprintf("label %q value %q: %s", key, value, strings.Join(msgs, "; ")))
		}
	}
	for _, spec := range b.NodeTaints {
		taint, err := parseTaint(spec)
		if err != nil {
			errs.add(src, "agent.node_taints", err.Error())
			continue
		}
		a.NodeTaints = append(a.NodeTaints, taint)
	}
	switch a.Runtime {
	case RuntimeContainerd, RuntimeSimulated:
	default:
		errs.add(src, "agent.runtime", fmt.Sprintf("%q is not one of containerd, simulated", a.Runtime))
	}
	for _, r := range b.Registries {
		reg := Registry{Host: r.Host, Endpoints: r.Endpoints}
		for _, opt := range []struct {
			from *bool
			to   *bool
		}{{r.PlainHTTP, &reg.PlainHTTP}, {r.InsecureSkipVerify, &reg.InsecureSkipVerify}} {
			if opt.from != nil {
				*opt.to = *opt.from
			}
		}
		if r.Username != nil {
			reg.Username = *r.Username
		}
		if r.Password != nil {
			reg.Password = *r.Password
		}
		a.Registries = append(a.Registries, reg)
	}
	a.Proxy = Proxy{Enabled: *b.Proxy.Enabled,
		MinSyncInterval:  errs.duration(src, "agent.proxy.min_sync_interval", *b.Proxy.MinSyncInterval),
		FullSyncInterval: errs.duration(src, "agent.proxy.full_sync_interval", *b.Proxy.FullSyncInterval)}
	if a.Proxy.MinSyncInterval > 0 && a.Proxy.FullSyncInterval > 0 && a.Proxy.FullSyncInterval < a.Proxy.MinSyncInterval {
		errs.add(src, "agent.proxy.full_sync_interval", fmt.Sprintf("%s is shorter than min_sync_interval (%s)", a.Proxy.FullSyncInterval, a.Proxy.MinSyncInterval))
	}
	a.NetworkPolicy = *b.NetworkPolicy.Enabled
	a.DNS = resolveDNS(b.DNS, src, &errs)
	sim := b.Simulated
	a.Simulated = Simulated{Nodes: *sim.Nodes, Pods: *sim.Pods, Zones: *sim.Zones, Labels: sim.Labels}
	if sim.Kubeconfig != nil {
		a.Simulated.Kubeconfig = *sim.Kubeconfig
	}
	if a.Runtime == RuntimeSimulated && a.Simulated.Nodes > 1 && a.Simulated.Kubeconfig == "" {
		errs.add(src, "agent.simulated.kubeconfig", "required to simulate more than one node: a node's join-token identity may write only its own Node")
	}
	for _, q := range []struct {
		key, val string
		out      *resource.Quantity
	}{{"agent.simulated.cpu", *sim.CPU, &a.Simulated.CPU}, {"agent.simulated.memory", *sim.Memory, &a.Simulated.Memory}} {
		v, err := resource.ParseQuantity(q.val)
		if err != nil {
			errs.add(src, q.key, fmt.Sprintf("%q is not a quantity such as \"4\" or \"8Gi\"", q.val))
		}
		*q.out = v
	}
	for _, n := range []struct {
		key string
		v   int
	}{{"agent.simulated.nodes", a.Simulated.Nodes}, {"agent.simulated.pods", a.Simulated.Pods}, {"agent.simulated.zones", a.Simulated.Zones}} {
		if n.v < 1 {
			errs.add(src, n.key, fmt.Sprintf("must be at least 1, got %d", n.v))
		}
	}
	if err := errs.err(); err != nil {
		return nil, err
	}
	return a, nil
}

// parseTaint reads "key=value:Effect" or "key:Effect", as `kubectl taint` writes them.
func parseTaint(spec string) (corev1.Taint, error) {
	kv, effect, ok := strings.Cut(spec, ":")
	if !ok {
		return corev1.Taint{}, fmt.Errorf("taint %q lacks an effect; write key=value:Effect", spec)
	}
	key, value, _ := strings.Cut(kv, "=")
	taint := corev1.Taint{Key: key, Value: value, Effect: corev1.TaintEffect(effect)}
	switch taint.Effect {
	case corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
	default:
		return taint, fmt.Errorf("taint %q: effect %q is not one of NoSchedule, PreferNoSchedule, NoExecute", spec, effect)
	}
	if msgs := validation.IsQualifiedName(key); len(msgs) > 0 {
		return taint, fmt.Errorf("taint %q: key: %s", spec, strings.Join(msgs, "; "))
	}
	if msgs := validation.IsValidLabelValue(value); value != "" && len(msgs) > 0 {
		return taint, fmt.Errorf("taint %q: value: %s", spec, strings.Join(msgs, "; "))
	}
	return taint, nil
}

// resolveDNS reads agent.dns and finds where the Corefile override starts in the file: its first line is the
// line after `<<EOF` for a heredoc, the attribute's line for a quoted string.
func resolveDNS(b *DNSBlock, src *source, errs *Errors) AgentDNS {
	d := AgentDNS{Enabled: *b.Enabled}
	if b.Corefile == nil {
		return d
	}
	d.Corefile = *b.Corefile
	if strings.TrimSpace(d.Corefile) == "" {
		errs.add(src, "agent.dns.corefile", "is empty; leave it out for the built-in Corefile")
		return d
	}
	if src == nil || src.body == nil {
		return d // set by flags: no file to point at
	}
	if attr := dnsCorefileAttr(src.body); attr != nil {
		d.CorefileFile, d.CorefileLine = src.path, attr.SrcRange.Start.Line
		if te, ok := attr.Expr.(*hclsyntax.TemplateExpr); ok && len(te.Parts) > 0 {
			d.CorefileLine = te.Parts[0].Range().Start.Line
		}
	}
	return d
}

// dnsCorefileAttr is the agent.dns.corefile attribute of a parsed file, or nil.
func dnsCorefileAttr(body *hclsyntax.Body) *hclsyntax.Attribute {
	for _, agent := range body.Blocks {
		if agent.Type != "agent" {
			continue
		}
		for _, dns := range agent.Body.Blocks {
			if dns.Type == "dns" {
				if attr, ok := dns.Body.Attributes["corefile"]; ok {
					return attr
				}
			}
		}
	}
	return nil
}
