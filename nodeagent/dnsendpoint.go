package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	mdns "github.com/miekg/dns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/nodeagent/dns"
	"github.com/skiff-dev/skiff/nodeagent/proxy"
)

// clusterFacts holds the servers' kube-system/skiff-cluster ConfigMap as the agent last read it.
type clusterFacts struct {
	mu      sync.Mutex
	facts   dns.Facts
	known   bool
	changed chan struct{} // closed and replaced on every change
}

func newClusterFacts() *clusterFacts { return &clusterFacts{changed: make(chan struct{})} }

func (c *clusterFacts) get() (dns.Facts, bool, <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.facts, c.known, c.changed
}

func (c *clusterFacts) set(f dns.Facts) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.known && c.facts == f {
		return
	}
	c.facts, c.known = f, true
	close(c.changed)
	c.changed = make(chan struct{})
}

// podDNS is the cluster DNS for pods' resolv.conf; zero until the facts are known.
func (c *clusterFacts) podDNS() clusterDNS {
	f, ok, _ := c.get()
	if !ok {
		return clusterDNS{}
	}
	return clusterDNS{IP: f.ClusterDNS, Domain: f.ClusterDomain, ServiceCIDR: f.ServiceCIDR}
}

// validateDNS checks agent.dns.corefile at agent start, so that a typo stops the agent with the file and
// line of the mistake rather than leaving its pods without DNS.
func validateDNS(cfg *config.Agent) error {
	if cfg.Runtime != config.RuntimeContainerd || !cfg.DNS.Enabled || cfg.DNS.Corefile == "" {
		return nil
	}
	return corefileError(cfg, dns.Validate(cfg.DNS.Corefile))
}

// corefileError places a Corefile error at its line of the agent's configuration file.
func corefileError(cfg *config.Agent, err error) error {
	var le *dns.LineError
	if err == nil || cfg.DNS.Corefile == "" || !errors.As(err, &le) {
		return err
	}
	e := config.Error{File: cfg.DNS.CorefileFile, Key: "agent.dns.corefile", Msg: le.Error()}
	if cfg.DNS.CorefileLine > 0 && le.Line > 0 {
		e.Line = cfg.DNS.CorefileLine + le.Line - 1
	}
	return e
}

// watchClusterFacts follows the skiff-cluster ConfigMap until ctx ends. It waits up to wait for the first
// version, so that the first pods get the cluster DNS; past that, pods start with the node's resolver (as the
// kubelet does without clusterDNS) and later pods pick the facts up when they arrive.
func (a *Agent) watchClusterFacts(ctx context.Context, wait time.Duration) {
	factory := informers.NewSharedInformerFactoryWithOptions(a.client, 0, informers.WithNamespace(dns.FactsNamespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", dns.FactsName).String()
		}))
	read := func(obj any) {
		cm, ok := obj.(*corev1.ConfigMap)
		if !ok {
			return
		}
		f, err := dns.FactsFrom(cm)
		if err != nil {
			a.logger.Warn("ignoring the cluster facts", "error", err)
			return
		}
		a.facts.set(f)
	}
	_, _ = factory.Core().V1().ConfigMaps().Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: read, UpdateFunc: func(_, cur any) { read(cur) }})
	factory.Start(ctx.Done())
	go func() {
		<-ctx.Done()
		factory.Shutdown()
	}()
	_, known, changed := a.facts.get()
	if known {
		return
	}
	select {
	case <-changed:
	case <-ctx.Done():
	case <-time.After(wait):
		a.logger.Warn("no cluster facts yet; pods use the node's resolver until the servers publish them",
			"configmap", dns.FactsNamespace+"/"+dns.FactsName, "waited", wait)
	}
}

// gatewayAddr is the first address of a pod CIDR: the address the CNI bridge plugin gives the bridge.
func gatewayAddr(podCIDR string) (net.IP, *net.IPNet, error) {
	_, ipn, err := net.ParseCIDR(podCIDR)
	if err != nil || ipn.IP.To4() == nil {
		return nil, nil, fmt.Errorf("pod CIDR %q is not an IPv4 CIDR", podCIDR)
	}
	gw := make(net.IP, 4)
	copy(gw, ipn.IP.To4())
	gw[3]++
	return gw, ipn, nil
}

// ensureBridge makes sure the node's pod bridge exists (claimBridge), is up and carries the gateway address before the
// first pod creates it, so that CoreDNS can listen there from the start. The CNI bridge plugin takes over a
// bridge that already has its gateway address.
func ensureBridge(ctx context.Context, bridge, owner string, gw net.IP, ipn *net.IPNet) error {
	ones, _ := ipn.Mask.Size()
	run := func(args ...string) error {
		out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	if err := claimBridge(ctx, bridge, owner); err != nil {
		return err
	}
	if err := run("addr", "replace", fmt.Sprintf("%s/%d", gw, ones), "dev", bridge); err != nil {
		return err
	}
	return run("link", "set", bridge, "up")
}

// dnsDir is where the node's DNS process keeps its files (see nodeagent/dns/child.go).
func dnsDir(cfg *config.Agent) string { return filepath.Join(cfg.DataDir, "dns") }

// runClusterDNS keeps the cluster DNS on this node until ctx ends:
//  1. wait for the cluster facts (the domain is part of the Corefile);
//  2. make sure of the pod bridge and its gateway address, where CoreDNS listens;
//  3. make sure the node's DNS process serves the Corefile for the facts (adopting the one a previous run of
//     the agent started, which kept answering meanwhile), with the API servers the agent knows now;
//  4. advertise it in the node's kube-dns EndpointSlice, ready once it answers;
//  5. recheck every 30 s (readiness, the slice itself, the servers); replace the process when the facts change.
//
// When ctx ends the process is left running, as the pods are: it stops only at teardown.
func (a *Agent) runClusterDNS(ctx context.Context, access *apiAccess, node *corev1.Node, podCIDR string) {
	logger := a.logger.Named("dns")
	gw, ipn, err := gatewayAddr(podCIDR)
	if err != nil {
		logger.Error("no cluster DNS on this node", "error", err)
		return
	}
	binary, err := os.Executable()
	if err != nil {
		logger.Error("no cluster DNS on this node: finding the agent's binary", "error", err)
		return
	}
	addr := net.JoinHostPort(gw.String(), "53")
	serving, ready, advertised := false, false, false
	failures := 0
	var probe readiness
	for {
		facts, known, changed := a.facts.get()
		if known {
			started, err := a.ensureNodeDNS(ctx, binary, facts, gw, ipn, access)
			switch {
			case err != nil:
				failures++
				serving = false
				logger.Error("running the node's DNS", "error", err)
			case started:
				failures, serving = 0, true
				logger.Info("node DNS started", "address", addr, "domain", facts.ClusterDomain)
			default:
				failures, serving = 0, true
			}
		}
		if serving {
			now := probe.observe(answers(ctx, addr, facts.ClusterDomain))
			if now != ready || !advertised {
				if err := dns.ApplySlice(ctx, a.client, dns.Slice(node, gw.String(), now)); err != nil {
					logger.Warn("advertising the node's DNS", "error", err)
				} else {
					ready, advertised = now, true
				}
			}
		}
		next := 30 * time.Second
		if !serving && known {
			next = min(time.Second<<min(failures, 5), 30*time.Second)
		} else if serving && (!ready || probe.failing > 0) {
			next = time.Second
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-time.After(next):
			advertised = false // rewrite the slice now and then: it may have been deleted
		}
	}
}

// ensureNodeDNS renders the Corefile for the facts and has the node's DNS process serve it.
func (a *Agent) ensureNodeDNS(ctx context.Context, binary string, facts dns.Facts, gw net.IP, ipn *net.IPNet, access *apiAccess) (bool, error) {
	id := hostID(a.cfg.Name, a.cfg.DataDir)
	if err := ensureBridge(ctx, bridgeOf(id), proxy.OwnerComment(id, a.cfg.DataDir), gw, ipn); err != nil {
		return false, err
	}
	tmpl := dns.DefaultCorefile
	if a.cfg.DNS.Corefile != "" {
		tmpl = a.cfg.DNS.Corefile
	}
	dir := dnsDir(a.cfg)
	corefile, err := dns.Render(tmpl, dns.Params{ClusterDomain: facts.ClusterDomain, Bind: gw.String(), Port: 53, Kubeconfig: dns.KubeconfigPath(dir),
		HealthAddr: net.JoinHostPort(gw.String(), "8080"), MetricsAddr: net.JoinHostPort(gw.String(), "9153"), Upstream: hostResolvConfPath})
	if err != nil {
		return false, corefileError(a.cfg, err)
	}
	spec := dns.Spec{Corefile: corefile, Servers: a.serverAddrs(), CA: access.caPEM, ClientCert: access.clientCertFile}
	return dns.EnsureChild(dir, binary, spec, a.logger.Named("dns"))
}

// probeFailureThreshold is how many probes in a row must fail before the node's DNS is advertised as not
// ready, as a readiness probe's failureThreshold: one slow answer under load must not make the proxy drop
// every query of the node's pods until the next probe.
const probeFailureThreshold = 3

// readiness turns probe results into the advertised readiness: ready at the first success, not ready after
// probeFailureThreshold failures in a row.
type readiness struct {
	ready   bool
	failing int // failures in a row
}

func (r *readiness) observe(ok bool) bool {
	if ok {
		r.ready, r.failing = true, 0
		return true
	}
	r.failing++
	if r.failing >= probeFailureThreshold {
		r.ready = false
	}
	return r.ready
}

// answers tells whether CoreDNS at addr answers a query for the cluster domain's SOA (any well-formed
// response counts: SERVFAIL while the plugin's caches sync is still an answer, but not a ready one).
func answers(ctx context.Context, addr, domain string) bool {
	m := new(mdns.Msg)
	m.SetQuestion(mdns.Fqdn(domain), mdns.TypeSOA)
	c := &mdns.Client{Timeout: time.Second}
	r, _, err := c.ExchangeContext(ctx, m, addr)
	return err == nil && r.Rcode == mdns.RcodeSuccess
}
