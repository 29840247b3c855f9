package proxy

import (
	"crypto/sha256"
	"fmt"
	"hash"
	"net"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// NodeFacts is what the rules depend on besides the Services and EndpointSlices.
type NodeFacts struct {
	ID       string // the agent's host id: chain names carry it
	Owner    string // OwnerComment of the agent
	NodeName string // endpoints with this nodeName are local
	// PodCIDR is this node's pod CIDR. Traffic to a ClusterIP from outside it is masqueraded, as kube-proxy
	// does with --detect-local-mode=NodeCIDR (the servers' cluster CIDR is not known to agents; other nodes'
	// pods never reach this node's ClusterIP rules, since their own node translates first). Empty: none is.
	PodCIDR     string
	SCTP        bool // the kernel and iptables can match and translate SCTP
	RandomFully bool // MASQUERADE --random-fully is available
	// Existing are the agent's chains present now, by table; those the new rules do not declare are deleted
	// in the same transaction.
	Existing map[string][]string
	// Previous are the PortHashes of the last restore that succeeded, when every chain it wrote is still in
	// place; a service port whose chains hash the same is not written again (kube-proxy's partial sync), as
	// restoring thousands of unchanged chains is what makes a sync slow. Nil writes everything.
	Previous map[string]string
}

// Ruleset is the result of BuildRules.
type Ruleset struct {
	// Restore is the iptables-restore --noflush input: the filter and nat tables, each rewriting all of the
	// agent's chains and deleting its stale ones.
	Restore []byte
	// Chains are the chains Restore leaves, by table: the next sync's Existing.
	Chains   map[string][]string
	Problems []Problem
	// UDP are the UDP translations the rules make, for conntrack clean-up when one goes away.
	UDP map[udpFlow]bool
	// UDPServed are the UDP destinations that have endpoints: stale entries of a destination that had none
	// (which conntrack keeps as untranslated flows) are flushed when it gets some.
	UDPServed map[udpDest]bool
	// PortHashes fingerprint each service port's own chains, for the next sync's Previous.
	PortHashes map[string]string
	// Fingerprint identifies the whole rule set the restore leads to (shared chains, every service port's
	// chains, deletions), whichever part of it Restore writes: two syncs with the same fingerprint leave
	// iptables the same, so the second need not restore anything.
	Fingerprint string
	// ServicePorts and Endpoints count what was programmed; Written counts the service ports written.
	ServicePorts, Endpoints, Written int
}

// udpDest is a ClusterIP (ip set) or a NodePort (port set).
type udpDest struct {
	ip       string
	nodePort int32
}

// udpFlow is a UDP destination translated to an endpoint IP.
type udpFlow struct {
	dest       udpDest
	endpointIP string
}

// servicePort is one port of one Service, with what the rules need of it.
type servicePort struct {
	svc                                *corev1.Service
	port                               corev1.ServicePort
	name                               string // namespace/name:port, as in comments and hashes
	protocol                           string // lower case, as iptables spells it
	nodePort                           int32  // 0: none, or not programmed (a clash)
	affinity                           int32  // sessionAffinity ClientIP timeout in seconds; 0: none
	internal, external, cluster, local []endpoint
}

// BuildRules turns Services and EndpointSlices into the agent's whole rule set. It is a pure function of its
// input, so the rules can be tested and benchmarked without iptables. Services it cannot program, in whole or
// in part, and malformed slices come back as Problems; everything else is programmed regardless.
//
// Chains (nat unless said), with <id> the agent's host id:
//
//	PREROUTING, OUTPUT -> SKIFF-<id>-SVCS: per ClusterIP port -> S-<hash> (or L-<hash>, internalTrafficPolicy
//	    Local); per external IP and load balancer address -> mark, then S-<hash>; or X-<hash>; last, for
//	    traffic addressed to this host -> SKIFF-<id>-NODEPORTS
//	SKIFF-<id>-NODEPORTS: per NodePort -> mark, then S-<hash>; or X-<hash> (externalTrafficPolicy Local)
//	S-/L-/X-<hash>: random-probability choice among endpoints -> E-<hash>
//	E-<hash>: hairpin mark, then DNAT to the endpoint
//	POSTROUTING -> SKIFF-<id>-POSTRTG: MASQUERADE of marked packets
//	filter INPUT, FORWARD, OUTPUT -> SKIFF-<id>-FILTER: REJECT for ports without endpoints (clients fail
//	    fast), DROP for Local policies without local endpoints and for sources outside a load balancer's
//	    loadBalancerSourceRanges
func BuildRules(services []*corev1.Service, slices []*discoveryv1.EndpointSlice, node NodeFacts) *Ruleset {
	n := namesFor(node.ID)
	index, problems := indexSlices(slices)
	ports, portProblems := servicePorts(services, index, node)
	problems = append(problems, portProblems...)

	rs := &Ruleset{Chains: map[string][]string{}, Problems: problems, UDP: map[udpFlow]bool{}, UDPServed: map[udpDest]bool{},
		PortHashes: map[string]string{}}
	nat := newTableWriter("nat")
	filter := newTableWriter("filter")
	owner := commentArg(node.Owner)

	filter.chain(n.filter)
	filter.rule(n.filter, owner)
	for _, c := range []string{n.services, n.nodePorts, n.markMasq, n.postrouting} {
		nat.chain(c)
	}
	nat.rule(n.services, owner)
	nat.rule(n.markMasq, "-j MARK --or-mark "+masqueradeMark)
	nat.rule(n.postrouting, owner)
	nat.rule(n.postrouting, "-m mark ! --mark "+masqueradeMark+"/"+masqueradeMark+" -j RETURN")
	nat.rule(n.postrouting, "-j MARK --xor-mark "+masqueradeMark) // so a packet is not masqueraded twice
	masq := "-j MASQUERADE"
	if node.RandomFully {
		masq += " --random-fully"
	}
	nat.rule(n.postrouting, masq)

	whole := sha256.New()
	for _, sp := range ports {
		rs.ServicePorts++
		own := newTableWriter("nat")
		writeServicePort(nat, own, filter, n, node, sp, rs)
		sum := sha256.Sum256([]byte(own.chains.String() + own.rules.String()))
		hash := string(sum[:])
		rs.PortHashes[sp.name] = hash
		whole.Write([]byte(sp.name + "\x00" + hash))
		if node.Previous != nil && node.Previous[sp.name] == hash {
			nat.keep(own.declared) // in place already, as this sync would write them
			continue
		}
		rs.Written++
		nat.append(own)
	}
	nat.rule(n.services, "-m comment --comment \"node ports\" -m addrtype --dst-type LOCAL -j "+n.nodePorts)

	for _, t := range []*tableWriter{filter, nat} {
		t.deleteStale(node.Existing[t.name])
		rs.Chains[t.name] = t.declared
		whole.Write(t.digest.Sum(nil))
	}
	rs.Fingerprint = string(whole.Sum(nil))
	var b strings.Builder
	b.Grow(filter.size() + nat.size())
	filter.writeTo(&b)
	nat.writeTo(&b)
	rs.Restore = []byte(b.String())
	return rs
}

// servicePorts selects and describes the ports to program, sorted by name so the rules are stable. The
// first Service (oldest, then by name) to claim a NodePort keeps it; a later one loses only that NodePort.
func servicePorts(services []*corev1.Service, index endpointIndex, node NodeFacts) ([]*servicePort, []Problem) {
	ordered := append([]*corev1.Service(nil), services...)
	sort.Slice(ordered, func(i, j int) bool {
		a, b := ordered[i], ordered[j]
		if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
			return a.CreationTimestamp.Before(&b.CreationTimestamp)
		}
		return a.Namespace+"/"+a.Name < b.Namespace+"/"+b.Name
	})
	var out []*servicePort
	var problems []Problem
	nodePorts := map[string]string{} // protocol/port -> service port name
	for _, svc := range ordered {
		if svc.Spec.Type == corev1.ServiceTypeExternalName || svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == corev1.ClusterIPNone {
			continue // no virtual IP: DNS alone serves these
		}
		if ip := net.ParseIP(svc.Spec.ClusterIP); ip == nil || ip.To4() == nil {
			problems = append(problems, Problem{Object: svc, Reason: ReasonBadClusterIP,
				Message: fmt.Sprintf("the service proxy programs IPv4 ClusterIPs only, not %q", svc.Spec.ClusterIP)})
			continue
		}
		key := svc.Namespace + "/" + svc.Name
		for _, port := range svc.Spec.Ports {
			sp := &servicePort{svc: svc, port: port, name: key + ":" + port.Name, nodePort: port.NodePort}
			if port.Name == "" {
				sp.name = fmt.Sprintf("%s:%d", key, port.Port)
			}
			switch proto := port.Protocol; {
			case proto == corev1.ProtocolTCP || proto == corev1.ProtocolUDP || proto == "":
				sp.protocol = strings.ToLower(string(proto))
				if proto == "" {
					sp.protocol = "tcp"
				}
			case proto == corev1.ProtocolSCTP && node.SCTP:
				sp.protocol = "sctp"
			default:
				problems = append(problems, Problem{Object: svc, Reason: ReasonUnsupportedProtocol,
					Message: fmt.Sprintf("port %s: protocol %s is not available on node %s; the port is not programmed", portLabel(port), proto, node.NodeName)})
				continue
			}
			if sp.nodePort != 0 && svc.Spec.Type != corev1.ServiceTypeNodePort && svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
				sp.nodePort = 0
			}
			if sp.nodePort != 0 {
				claim := fmt.Sprintf("%s/%d", sp.protocol, sp.nodePort)
				if holder, taken := nodePorts[claim]; taken {
					problems = append(problems, Problem{Object: svc, Reason: ReasonNodePortClash,
						Message: fmt.Sprintf("port %s: nodePort %d/%s is already used by %s; only its ClusterIP is programmed", portLabel(port), sp.nodePort, port.Protocol, holder)})
					sp.nodePort = 0
				} else {
					nodePorts[claim] = sp.name
				}
			}
			if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
				sp.affinity = corev1.DefaultClientIPServiceAffinitySeconds
				if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
					sp.affinity = *c.ClientIP.TimeoutSeconds
				}
			}
			protocol := port.Protocol
			if protocol == "" {
				protocol = corev1.ProtocolTCP
			}
			all := index[key][slicePortKey{name: port.Name, protocol: protocol}]
			sp.cluster = usable(all, func(endpoint) bool { return true })
			sp.local = usable(all, func(e endpoint) bool { return e.node == node.NodeName })
			sp.internal, sp.external = sp.cluster, sp.cluster
			if p := svc.Spec.InternalTrafficPolicy; p != nil && *p == corev1.ServiceInternalTrafficPolicyLocal {
				sp.internal = sp.local
			}
			if sp.externalLocal() {
				sp.external = sp.local
			}
			out = append(out, sp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, problems
}

func (sp *servicePort) internalLocal() bool {
	p := sp.svc.Spec.InternalTrafficPolicy
	return p != nil && *p == corev1.ServiceInternalTrafficPolicyLocal
}

func (sp *servicePort) externalLocal() bool {
	return sp.svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
}

func portLabel(p corev1.ServicePort) string {
	if p.Name != "" {
		return fmt.Sprintf("%q (%d)", p.Name, p.Port)
	}
	return fmt.Sprint(p.Port)
}

// writeServicePort writes one service port's rules; the steps follow the chain layout of BuildRules.
// The service port's own chains go to own, its rules in the shared chains to nat and filter.
func writeServicePort(nat, own, filter *tableWriter, n chainNames, node NodeFacts, sp *servicePort, rs *Ruleset) {
	proto := "-p " + sp.protocol + " -m " + sp.protocol
	dest := fmt.Sprintf("-d %s/32 %s --dport %d", sp.svc.Spec.ClusterIP, proto, sp.port.Port)
	nodePort := fmt.Sprintf("%s --dport %d", proto, sp.nodePort)
	comment := commentArg(sp.name)
	clusterChain := n.hashedChain(n.servicePfx, node.ID, sp.name, sp.protocol)

	// 1. Endpoint chains, shared by every chain that picks among them.
	endpointChain := map[string]string{}
	for _, e := range sp.cluster {
		c := n.hashedChain(n.endpointPfx, node.ID, sp.name, sp.protocol, e.hostPort())
		endpointChain[e.hostPort()] = c
		own.chain(c)
		own.rule(c, fmt.Sprintf("%s -s %s/32 -j %s", comment, e.ip, n.markMasq)) // hairpin: a pod reaching itself
		affinity := ""
		if sp.affinity > 0 {
			affinity = fmt.Sprintf(" -m recent --name %s --set", c)
		}
		own.rule(c, fmt.Sprintf("%s %s%s -j DNAT --to-destination %s", comment, proto, affinity, e.hostPort()))
		rs.Endpoints++
		if sp.protocol == "udp" {
			rs.UDP[udpFlow{udpDest{ip: sp.svc.Spec.ClusterIP}, e.ip}] = true
			if sp.nodePort != 0 {
				rs.UDP[udpFlow{udpDest{nodePort: sp.nodePort}, e.ip}] = true
			}
		}
	}
	if len(sp.cluster) > 0 {
		own.chain(clusterChain)
		balance(own, clusterChain, comment, sp, sp.cluster, endpointChain)
	}

	// 2. ClusterIP: masquerade what comes from outside the pod CIDR (so replies return through this node),
	// then pick an endpoint; without one, REJECT (none at all) or DROP (none local for a Local policy).
	switch {
	case len(sp.internal) > 0:
		target := clusterChain
		if sp.internalLocal() {
			target = n.hashedChain(n.localPfx, node.ID, sp.name, sp.protocol)
			own.chain(target)
			balance(own, target, comment, sp, sp.internal, endpointChain)
		}
		if node.PodCIDR != "" {
			nat.rule(n.services, fmt.Sprintf("%s ! -s %s %s -j %s", comment, node.PodCIDR, dest, n.markMasq))
		}
		nat.rule(n.services, fmt.Sprintf("%s %s -j %s", comment, dest, target))
		if sp.protocol == "udp" {
			rs.UDPServed[udpDest{ip: sp.svc.Spec.ClusterIP}] = true
		}
	case len(sp.cluster) > 0:
		filter.rule(n.filter, fmt.Sprintf("%s %s -j DROP", comment, dest))
	default:
		filter.rule(n.filter, fmt.Sprintf("%s %s -j REJECT --reject-with icmp-port-unreachable", comment, dest))
	}

	// 3. External traffic: through a NodePort, an external IP or a load balancer's address. With
	// externalTrafficPolicy Local it keeps the client's address and so may use only local endpoints; traffic
	// from this node's pods and from the host itself is not external: it goes to every endpoint, as in
	// Kubernetes (the host's own, masqueraded, so the reply finds its way back).
	externalChain := ""
	if sp.externalLocal() && len(sp.cluster) > 0 {
		externalChain = n.hashedChain(n.externalPfx, node.ID, sp.name, sp.protocol)
		own.chain(externalChain)
		if node.PodCIDR != "" {
			own.rule(externalChain, fmt.Sprintf("%s -s %s -j %s", comment, node.PodCIDR, clusterChain))
		}
		own.rule(externalChain, fmt.Sprintf("%s -m addrtype --src-type LOCAL -j %s", comment, n.markMasq))
		own.rule(externalChain, fmt.Sprintf("%s -m addrtype --src-type LOCAL -j %s", comment, clusterChain))
		if len(sp.local) > 0 {
			balance(own, externalChain, comment, sp, sp.local, endpointChain)
		}
	}
	// external sends traffic that matches match in chain on: REJECT without endpoints, masqueraded to any
	// endpoint (Cluster: replies must come back through this node), or to the Local chain (DROP when it has
	// no local endpoint). filterMatch is the same traffic as the filter table sees it.
	external := func(chain, match, filterMatch string) {
		switch {
		case len(sp.cluster) == 0:
			filter.rule(n.filter, fmt.Sprintf("%s %s -j REJECT --reject-with icmp-port-unreachable", comment, filterMatch))
		case externalChain == "":
			nat.rule(chain, fmt.Sprintf("%s %s -j %s", comment, match, n.markMasq))
			nat.rule(chain, fmt.Sprintf("%s %s -j %s", comment, match, clusterChain))
		default:
			nat.rule(chain, fmt.Sprintf("%s %s -j %s", comment, match, externalChain))
			if len(sp.local) == 0 {
				filter.rule(n.filter, fmt.Sprintf("%s %s -j DROP", comment, filterMatch))
			}
		}
	}

	// 3a. NodePort, on this host's own addresses.
	if sp.nodePort != 0 {
		if sp.protocol == "udp" && len(sp.external) > 0 {
			rs.UDPServed[udpDest{nodePort: sp.nodePort}] = true
		}
		external(n.nodePorts, nodePort, "-m addrtype --dst-type LOCAL "+nodePort)
	}

	// 3b. External IPs and the load balancer's addresses, on every node as kube-proxy programs them: a node
	// that receives traffic for one (the one announcing it, or a router's choice) serves it. Sources outside
	// loadBalancerSourceRanges are not translated, and what is still addressed to a load balancer's address
	// in the filter table is dropped.
	for _, addr := range sp.externalAddrs() {
		match := fmt.Sprintf("-d %s/32 %s --dport %d", addr.ip, proto, sp.port.Port)
		if sp.protocol == "udp" && len(sp.external) > 0 {
			rs.UDPServed[udpDest{ip: addr.ip}] = true
			for _, e := range sp.external {
				rs.UDP[udpFlow{udpDest{ip: addr.ip}, e.ip}] = true
			}
		}
		ranges := sp.svc.Spec.LoadBalancerSourceRanges
		if !addr.loadBalancer || len(ranges) == 0 {
			external(n.services, match, match)
			continue
		}
		if len(sp.cluster) == 0 {
			external(n.services, match, match)
			continue
		}
		for _, r := range ranges {
			external(n.services, fmt.Sprintf("-s %s %s", strings.TrimSpace(r), match), match)
		}
		filter.rule(n.filter, fmt.Sprintf("%s %s -j DROP", comment, match))
	}
}

// externalAddr is an address a service port is reached at from outside the cluster.
type externalAddr struct {
	ip           string
	loadBalancer bool // a load balancer's ingress address (else one of spec.externalIPs)
}

// externalAddrs are the port's external IPs and, for a LoadBalancer Service, the IPv4 addresses of its load
// balancer's ingress that traffic reaches the nodes at (ipMode VIP, the default; a Proxy-mode balancer sends
// its own traffic to the nodes' NodePorts). Duplicates are listed once.
func (sp *servicePort) externalAddrs() []externalAddr {
	var out []externalAddr
	seen := map[string]bool{}
	add := func(ip string, lb bool) {
		if parsed := net.ParseIP(ip); parsed == nil || parsed.To4() == nil || seen[ip] {
			return
		}
		seen[ip] = true
		out = append(out, externalAddr{ip: ip, loadBalancer: lb})
	}
	for _, ip := range sp.svc.Spec.ExternalIPs {
		add(ip, false)
	}
	if sp.svc.Spec.Type == corev1.ServiceTypeLoadBalancer {
		for _, in := range sp.svc.Status.LoadBalancer.Ingress {
			if in.IPMode == nil || *in.IPMode == corev1.LoadBalancerIPModeVIP {
				add(in.IP, true)
			}
		}
	}
	return out
}

// commentArg is a comment match; the text never holds a quote or backslash (object names cannot, and
// OwnerComment leaves out data dirs that do), so plain double quotes are enough for iptables-restore.
func commentArg(text string) string { return `-m comment --comment "` + text + `"` }

// balance sends a chain's traffic to one of eps: the endpoint a client used within the affinity timeout, or
// else endpoint i of n with probability 1/(n-i), the last one unconditionally.
func balance(nat *tableWriter, chain, comment string, sp *servicePort, eps []endpoint, endpointChain map[string]string) {
	if sp.affinity > 0 {
		for _, e := range eps {
			c := endpointChain[e.hostPort()]
			nat.rule(chain, fmt.Sprintf("%s -m recent --name %s --rcheck --seconds %d --reap -j %s", comment, c, sp.affinity, c))
		}
	}
	for i, e := range eps {
		c := endpointChain[e.hostPort()]
		if left := len(eps) - i; left > 1 {
			nat.rule(chain, fmt.Sprintf("%s -m statistic --mode random --probability %0.10f -j %s", comment, 1/float64(left), c))
		} else {
			nat.rule(chain, fmt.Sprintf("%s -j %s", comment, c))
		}
	}
}

// tableWriter collects one table's part of a restore: chain declarations first, then rules, then deletions.
type tableWriter struct {
	name      string
	chains    strings.Builder
	rules     strings.Builder
	deletions strings.Builder
	declared  []string
	seen      map[string]bool
	// digest covers what is written to this writer directly (shared chains and rules, deletions), not what
	// append adds or keep stands for: those are the service ports', which PortHashes cover.
	digest hash.Hash
}

func newTableWriter(name string) *tableWriter {
	return &tableWriter{name: name, seen: map[string]bool{}, digest: sha256.New()}
}

// chain declares a chain; declaring flushes it, so the rules that follow replace the old ones atomically.
func (t *tableWriter) chain(name string) {
	if t.seen[name] {
		return
	}
	t.seen[name] = true
	t.declared = append(t.declared, name)
	t.chains.WriteString(":" + name + " - [0:0]\n")
	t.digest.Write([]byte(":" + name + "\n"))
}

// keep counts chains as declared without writing them: unchanged chains that stay as they are.
func (t *tableWriter) keep(chains []string) {
	for _, c := range chains {
		if !t.seen[c] {
			t.seen[c] = true
			t.declared = append(t.declared, c)
		}
	}
}

// append adds another writer's chains and rules.
func (t *tableWriter) append(o *tableWriter) {
	for _, c := range o.declared {
		if !t.seen[c] {
			t.seen[c] = true
			t.declared = append(t.declared, c)
		}
	}
	t.chains.WriteString(o.chains.String())
	t.rules.WriteString(o.rules.String())
}

func (t *tableWriter) rule(chain, spec string) {
	t.rules.WriteString("-A " + chain + " " + spec + "\n")
	t.digest.Write([]byte("-A " + chain + " " + spec + "\n"))
}

// deleteStale flushes and deletes the existing chains not declared this time (deleted Services' chains).
func (t *tableWriter) deleteStale(existing []string) {
	for _, c := range existing {
		if !t.seen[c] {
			t.chains.WriteString(":" + c + " - [0:0]\n")
			t.deletions.WriteString("-X " + c + "\n")
			t.digest.Write([]byte("-X " + c + "\n"))
		}
	}
}

func (t *tableWriter) size() int {
	return len(t.name) + t.chains.Len() + t.rules.Len() + t.deletions.Len() + 16
}

func (t *tableWriter) writeTo(b *strings.Builder) {
	b.WriteString("*" + t.name + "\n")
	b.WriteString(t.chains.String())
	b.WriteString(t.rules.String())
	b.WriteString(t.deletions.String())
	b.WriteString("COMMIT\n")
}
