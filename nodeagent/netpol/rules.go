package netpol

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"net"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Names. iptables allows 28 bytes in a chain name and ipset 31 in a set name; both start with
// "SKIFF-NP-<id>-" (18 bytes with the 8-digit host id), which the proxy's stale-owner sweep reads the owner
// from (proxy.chainOwnerID).
const (
	namePrefix  = "SKIFF-NP-"
	maxChainLen = 28
	maxSetLen   = 31
)

// Prefix is what every chain and set of the agent with this host id starts with.
func Prefix(id string) string { return namePrefix + id + "-" }

// ForwardChain is the chain FORWARD sends new connections to.
func ForwardChain(id string) string { return Prefix(id) + "FWD" }

func hashName(prefix string, max int, parts ...string) string {
	sum := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	enc := base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:])
	return prefix + enc[:max-len(prefix)]
}

// Input is what the rules are built from: the informers' objects and the agent's own knowledge.
type Input struct {
	ID    string // the agent's host id
	Owner string // proxy.OwnerComment of the agent
	// Policies, Pods and Namespaces are every object of the cluster.
	Policies   []*networkingv1.NetworkPolicy
	Pods       []*corev1.Pod
	Namespaces []*corev1.Namespace
	// Local tells the pods that run on this agent's nodes: only they get chains.
	Local func(*corev1.Pod) bool
	// Hints are the IPs of local pods whose status does not carry one yet: the agent wires a pod's network
	// before it reports the IP, and isolates it before its containers start.
	Hints map[types.UID]string
	// Existing are the agent's chains iptables has now; those no longer wanted are deleted.
	Existing []string
}

// Set is an ipset: its name, type and entries (sorted; hash:net entries may end in " nomatch").
type Set struct {
	Name, Type string
	Entries    []string
}

// Ruleset is the outcome of Build.
type Ruleset struct {
	Restore     []byte   // iptables-restore --noflush input for the filter table
	Chains      []string // the chains Restore declares
	Sets        []Set    // the sets its rules name, which must exist before it is restored
	Fingerprint string   // equal for equal rule sets
	Isolated    int      // local pods with a chain of their own (either direction)
}

// SelectsPod tells whether any of the policies isolates pod (for ingress or egress).
func SelectsPod(policies []*networkingv1.NetworkPolicy, pod *corev1.Pod) bool {
	for _, p := range policies {
		if p.Namespace == pod.Namespace && selects(p, pod) {
			return true
		}
	}
	return false
}

func selects(p *networkingv1.NetworkPolicy, pod *corev1.Pod) bool {
	sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
	return err == nil && sel.Matches(labels.Set(pod.Labels))
}

// policyTypes is the directions a policy isolates: as listed, or, when the list is empty (objects written
// before the field existed), ingress always and egress when it has egress rules.
func policyTypes(p *networkingv1.NetworkPolicy) (ingress, egress bool) {
	if len(p.Spec.PolicyTypes) == 0 {
		return true, len(p.Spec.Egress) > 0
	}
	for _, t := range p.Spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			ingress = true
		case networkingv1.PolicyTypeEgress:
			egress = true
		}
	}
	return ingress, egress
}

// podIP is a pod's IPv4 address, or "" for a pod that has none, uses the host's network, or has ended (its
// address may belong to another pod by now).
func podIP(pod *corev1.Pod, hints map[types.UID]string) string {
	if pod.Spec.HostNetwork || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return ""
	}
	for _, ip := range pod.Status.PodIPs {
		if parsed := net.ParseIP(ip.IP); parsed != nil && parsed.To4() != nil {
			return parsed.To4().String()
		}
	}
	if parsed := net.ParseIP(pod.Status.PodIP); parsed != nil && parsed.To4() != nil {
		return parsed.To4().String()
	}
	return hints[pod.UID]
}

// builder holds one Build's indexes and output.
type builder struct {
	in        Input
	podsByNS  map[string][]*corev1.Pod // pods with an IP, by namespace, in name order
	allPods   []*corev1.Pod
	ips       map[types.UID]string
	nsLabels  map[string]labels.Set
	nsNames   []string
	sets      map[string]Set
	filter    strings.Builder
	peerCache map[string]peers
}

// peers is what a rule's from/to list resolves to.
type peers struct {
	any    bool           // the list is empty: every address
	pods   []*corev1.Pod  // pods any selector peer picks, in name order, without repeats
	blocks []*net.IPNet   // ipBlock CIDRs (IPv4)
	except [][]*net.IPNet // each block's excepts
	sets   []string       // the sets that match the peers' addresses (a pod set, one set per block)
}

// Build turns the objects into the agent's chains and sets. It is a pure function of its input.
func Build(in Input) *Ruleset {
	b := &builder{in: in, podsByNS: map[string][]*corev1.Pod{}, ips: map[types.UID]string{},
		nsLabels: map[string]labels.Set{}, sets: map[string]Set{}, peerCache: map[string]peers{}}
	pods := append([]*corev1.Pod(nil), in.Pods...)
	sort.Slice(pods, func(i, j int) bool {
		if pods[i].Namespace != pods[j].Namespace {
			return pods[i].Namespace < pods[j].Namespace
		}
		return pods[i].Name < pods[j].Name
	})
	for _, pod := range pods {
		if ip := podIP(pod, in.Hints); ip != "" {
			b.ips[pod.UID] = ip
			b.podsByNS[pod.Namespace] = append(b.podsByNS[pod.Namespace], pod)
			b.allPods = append(b.allPods, pod)
		}
	}
	for _, ns := range in.Namespaces {
		b.nsLabels[ns.Name] = labels.Set(ns.Labels)
		b.nsNames = append(b.nsNames, ns.Name)
	}
	sort.Strings(b.nsNames)
	policies := append([]*networkingv1.NetworkPolicy(nil), in.Policies...)
	sort.Slice(policies, func(i, j int) bool {
		if policies[i].Namespace != policies[j].Namespace {
			return policies[i].Namespace < policies[j].Namespace
		}
		return policies[i].Name < policies[j].Name
	})
	byNS := map[string][]*networkingv1.NetworkPolicy{}
	for _, p := range policies {
		byNS[p.Namespace] = append(byNS[p.Namespace], p)
	}

	fwd := ForwardChain(in.ID)
	chains := []string{fwd}
	var jumps, ingressJumps []string
	var body strings.Builder
	isolated := 0
	for _, pod := range b.allPods {
		if in.Local == nil || !in.Local(pod) {
			continue
		}
		ip := b.ips[pod.UID]
		var ingress, egress []*networkingv1.NetworkPolicy
		for _, p := range byNS[pod.Namespace] {
			if !selects(p, pod) {
				continue
			}
			in, eg := policyTypes(p)
			if in {
				ingress = append(ingress, p)
			}
			if eg {
				egress = append(egress, p)
			}
		}
		if len(ingress) == 0 && len(egress) == 0 {
			continue
		}
		isolated++
		who := pod.Namespace + "/" + pod.Name
		if len(egress) > 0 {
			chain := hashName(Prefix(in.ID)+"E", maxChainLen, pod.Namespace, pod.Name, string(pod.UID))
			chains = append(chains, chain)
			jumps = append(jumps, fmt.Sprintf("-A %s -s %s/32 -j %s", fwd, ip, chain))
			b.egressChain(&body, chain, pod, egress)
			fmt.Fprintf(&body, "-A %s -m comment --comment \"egress of %s\" -j REJECT --reject-with icmp-port-unreachable\n", chain, who)
		}
		if len(ingress) > 0 {
			chain := hashName(Prefix(in.ID)+"I", maxChainLen, pod.Namespace, pod.Name, string(pod.UID))
			chains = append(chains, chain)
			ingressJumps = append(ingressJumps, fmt.Sprintf("-A %s -d %s/32 -j %s", fwd, ip, chain))
			b.ingressChain(&body, chain, pod, ingress)
			fmt.Fprintf(&body, "-A %s -m comment --comment \"ingress of %s\" -j REJECT --reject-with icmp-port-unreachable\n", chain, who)
		}
	}

	// Stale chains (pods gone or no longer isolated) are declared, which empties them (nft deletes only an
	// empty chain), and deleted after the rules that jumped to them are gone.
	wanted := map[string]bool{}
	for _, c := range chains {
		wanted[c] = true
	}
	existing := append([]string(nil), in.Existing...)
	sort.Strings(existing)
	var stale []string
	for _, c := range existing {
		if !wanted[c] && strings.HasPrefix(c, Prefix(in.ID)) {
			stale = append(stale, c)
		}
	}
	var out strings.Builder
	out.WriteString("*filter\n")
	for _, c := range append(append([]string(nil), chains...), stale...) {
		fmt.Fprintf(&out, ":%s - [0:0]\n", c)
	}
	fmt.Fprintf(&out, "-A %s -m comment --comment \"%s\"\n", fwd, in.Owner)
	// Egress first: a connection between two isolated pods of this node must pass both chains.
	for _, j := range append(jumps, ingressJumps...) {
		out.WriteString(j + "\n")
	}
	out.WriteString(body.String())
	for _, c := range stale {
		fmt.Fprintf(&out, "-X %s\n", c)
	}
	out.WriteString("COMMIT\n")

	rs := &Ruleset{Restore: []byte(out.String()), Chains: chains, Isolated: isolated}
	names := make([]string, 0, len(b.sets))
	for n := range b.sets {
		names = append(names, n)
	}
	sort.Strings(names)
	sum := sha256.New()
	sum.Write(rs.Restore)
	for _, n := range names {
		rs.Sets = append(rs.Sets, b.sets[n])
		sum.Write([]byte(n))
	}
	rs.Fingerprint = fmt.Sprintf("%x", sum.Sum(nil))
	return rs
}

// ingressChain writes the RETURN rules of a pod's ingress chain: one per (peer match, port) of each rule of
// each policy that isolates it for ingress. Named ports resolve on the pod itself.
func (b *builder) ingressChain(w *strings.Builder, chain string, pod *corev1.Pod, policies []*networkingv1.NetworkPolicy) {
	for _, p := range policies {
		for i, rule := range p.Spec.Ingress {
			comment := fmt.Sprintf("-m comment --comment \"%s/%s ingress %d\"", p.Namespace, p.Name, i)
			ports, ok := resolvePorts(rule.Ports, pod)
			if !ok {
				continue // only named ports the pod does not have: the rule allows nothing here
			}
			from := b.resolvePeers(p, "ingress", i, rule.From)
			for _, src := range from.matches("src") {
				for _, port := range ports {
					fmt.Fprintf(w, "-A %s %s%s%s -j RETURN\n", chain, comment, src, port)
				}
			}
		}
	}
}

// egressChain writes a pod's egress chain. Numeric ports are matched with the destination's address set;
// named ports resolve on each destination pod, whose (address, protocol, port) go in a hash:ip,port set.
func (b *builder) egressChain(w *strings.Builder, chain string, pod *corev1.Pod, policies []*networkingv1.NetworkPolicy) {
	for _, p := range policies {
		for i, rule := range p.Spec.Egress {
			comment := fmt.Sprintf("-m comment --comment \"%s/%s egress %d\"", p.Namespace, p.Name, i)
			to := b.resolvePeers(p, "egress", i, rule.To)
			var numeric, named []networkingv1.NetworkPolicyPort
			for _, port := range rule.Ports {
				if port.Port != nil && port.Port.Type == intstr.String {
					named = append(named, port)
				} else {
					numeric = append(numeric, port)
				}
			}
			if len(rule.Ports) == 0 || len(numeric) > 0 {
				ports, _ := resolvePorts(numeric, nil)
				for _, dst := range to.matches("dst") {
					for _, port := range ports {
						fmt.Fprintf(w, "-A %s %s%s%s -j RETURN\n", chain, comment, dst, port)
					}
				}
			}
			if len(named) > 0 {
				if set := b.namedPortSet(to, named); set != "" {
					fmt.Fprintf(w, "-A %s %s -m set --match-set %s dst,dst -j RETURN\n", chain, comment, set)
				}
			}
		}
	}
}

// matches is the iptables match of each of the peers' address groups (" -m set ..."), or one empty match
// for any address; none when the peers match no address.
func (p peers) matches(dir string) []string {
	if p.any {
		return []string{""}
	}
	out := make([]string, 0, len(p.sets))
	for _, s := range p.sets {
		out = append(out, fmt.Sprintf(" -m set --match-set %s %s", s, dir))
	}
	return out
}

// resolvePeers resolves one rule's from/to list, once per Build.
func (b *builder) resolvePeers(p *networkingv1.NetworkPolicy, dir string, rule int, list []networkingv1.NetworkPolicyPeer) peers {
	key := fmt.Sprintf("%s/%s/%s/%d", p.Namespace, p.Name, dir, rule)
	if cached, ok := b.peerCache[key]; ok {
		return cached
	}
	var out peers
	if len(list) == 0 {
		out.any = true
		b.peerCache[key] = out
		return out
	}
	seen := map[types.UID]bool{}
	for _, peer := range list {
		if peer.IPBlock != nil {
			block, excepts := parseBlock(peer.IPBlock)
			if block == nil {
				continue // IPv6, or malformed (refused by validation): matches no IPv4 address
			}
			out.blocks = append(out.blocks, block)
			out.except = append(out.except, excepts)
			out.sets = append(out.sets, b.netSet(block, excepts))
			continue
		}
		for _, pod := range b.peerPods(p.Namespace, peer) {
			if !seen[pod.UID] {
				seen[pod.UID] = true
				out.pods = append(out.pods, pod)
			}
		}
	}
	if len(out.pods) > 0 {
		entries := make([]string, 0, len(out.pods))
		for _, pod := range out.pods {
			entries = append(entries, b.ips[pod.UID])
		}
		out.sets = append([]string{b.addSet("hash:ip", entries)}, out.sets...)
	}
	b.peerCache[key] = out
	return out
}

// peerPods is the pods (with an address) one selector peer picks: by pod selector in the policy's
// namespace, by namespace selector in every matching namespace, or by both.
func (b *builder) peerPods(policyNS string, peer networkingv1.NetworkPolicyPeer) []*corev1.Pod {
	podSel := labels.Everything()
	if peer.PodSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(peer.PodSelector)
		if err != nil {
			return nil
		}
		podSel = sel
	}
	namespaces := []string{policyNS}
	if peer.NamespaceSelector != nil {
		nsSel, err := metav1.LabelSelectorAsSelector(peer.NamespaceSelector)
		if err != nil {
			return nil
		}
		namespaces = nil
		for _, ns := range b.nsNames {
			if nsSel.Matches(b.nsLabels[ns]) {
				namespaces = append(namespaces, ns)
			}
		}
	}
	var out []*corev1.Pod
	for _, ns := range namespaces {
		for _, pod := range b.podsByNS[ns] {
			if podSel.Matches(labels.Set(pod.Labels)) {
				out = append(out, pod)
			}
		}
	}
	return out
}

// namedPortSet is the hash:ip,port set of the destinations a list of named ports resolves to: for each pod
// the peers take in (every pod when the peers are any address; the pods inside an ipBlock count), its
// container port of that name and protocol. "" when none resolves.
func (b *builder) namedPortSet(to peers, ports []networkingv1.NetworkPolicyPort) string {
	candidates := to.pods
	if to.any || len(to.blocks) > 0 {
		candidates = nil
		for _, pod := range b.allPods {
			if to.any || to.takesPod(pod, b.ips[pod.UID]) {
				candidates = append(candidates, pod)
			}
		}
	}
	var entries []string
	for _, pod := range candidates {
		for _, port := range ports {
			proto := protocolOf(port)
			if n := namedPort(pod, port.Port.StrVal, proto); n > 0 {
				entries = append(entries, fmt.Sprintf("%s,%s:%d", b.ips[pod.UID], strings.ToLower(string(proto)), n))
			}
		}
	}
	if len(entries) == 0 {
		return ""
	}
	return b.addSet("hash:ip,port", entries)
}

// takesPod tells whether a pod is one of the peers: picked by a selector, or inside a block and no except.
func (p peers) takesPod(pod *corev1.Pod, ip string) bool {
	for _, q := range p.pods {
		if q.UID == pod.UID {
			return true
		}
	}
	addr := net.ParseIP(ip)
	for i, block := range p.blocks {
		if !block.Contains(addr) {
			continue
		}
		excluded := false
		for _, e := range p.except[i] {
			excluded = excluded || e.Contains(addr)
		}
		if !excluded {
			return true
		}
	}
	return false
}

// netSet is the hash:net set of an ipBlock: its CIDR (hash:net holds no /0, so 0.0.0.0/0 is its two
// halves) and each except as a nomatch entry, which wins over the wider CIDR.
func (b *builder) netSet(block *net.IPNet, excepts []*net.IPNet) string {
	var entries []string
	if ones, _ := block.Mask.Size(); ones == 0 {
		entries = append(entries, "0.0.0.0/1", "128.0.0.0/1")
	} else {
		entries = append(entries, block.String())
	}
	for _, e := range excepts {
		if ones, _ := e.Mask.Size(); ones == 0 {
			return b.addSet("hash:net", []string{"0.0.0.0/1 nomatch", "128.0.0.0/1 nomatch"})
		}
		entries = append(entries, e.String()+" nomatch")
	}
	return b.addSet("hash:net", entries)
}

// addSet records a set by its contents and returns its name.
func (b *builder) addSet(kind string, entries []string) string {
	entries = append([]string(nil), entries...)
	sort.Strings(entries)
	uniq := entries[:0]
	for i, e := range entries {
		if i == 0 || e != entries[i-1] {
			uniq = append(uniq, e)
		}
	}
	name := hashName(Prefix(b.in.ID), maxSetLen, append([]string{kind}, uniq...)...)
	b.sets[name] = Set{Name: name, Type: kind, Entries: uniq}
	return name
}

// parseBlock reads an ipBlock; nil for an IPv6 or malformed one.
func parseBlock(block *networkingv1.IPBlock) (*net.IPNet, []*net.IPNet) {
	_, cidr, err := net.ParseCIDR(block.CIDR)
	if err != nil || cidr.IP.To4() == nil {
		return nil, nil
	}
	var excepts []*net.IPNet
	for _, e := range block.Except {
		if _, ex, err := net.ParseCIDR(e); err == nil && ex.IP.To4() != nil {
			excepts = append(excepts, ex)
		}
	}
	return cidr, excepts
}

func protocolOf(port networkingv1.NetworkPolicyPort) corev1.Protocol {
	if port.Protocol != nil {
		return *port.Protocol
	}
	return corev1.ProtocolTCP
}

// resolvePorts is the iptables match of each port (" -p tcp -m tcp --dport 80:90"); one empty match when
// the list is empty (every port). Named ports resolve on pod (nil: they are skipped); ok is false when
// ports were given and none resolved.
func resolvePorts(ports []networkingv1.NetworkPolicyPort, pod *corev1.Pod) (out []string, ok bool) {
	if len(ports) == 0 {
		return []string{""}, true
	}
	for _, port := range ports {
		proto := strings.ToLower(string(protocolOf(port)))
		if port.Port == nil {
			out = append(out, fmt.Sprintf(" -p %s", proto))
			continue
		}
		number := port.Port.IntVal
		if port.Port.Type == intstr.String {
			if pod == nil {
				continue
			}
			number = namedPort(pod, port.Port.StrVal, protocolOf(port))
			if number == 0 {
				continue
			}
		}
		if port.EndPort != nil && *port.EndPort > number && port.Port.Type == intstr.Int {
			out = append(out, fmt.Sprintf(" -p %s -m %s --dport %d:%d", proto, proto, number, *port.EndPort))
		} else {
			out = append(out, fmt.Sprintf(" -p %s -m %s --dport %d", proto, proto, number))
		}
	}
	return out, len(out) > 0
}

// namedPort is the number of a pod's container port with this name and protocol, 0 when it has none. Ports
// of sidecars (init containers that keep running) count, as the kubelet reports them.
func namedPort(pod *corev1.Pod, name string, proto corev1.Protocol) int32 {
	find := func(containers []corev1.Container, sidecarsOnly bool) int32 {
		for _, c := range containers {
			if sidecarsOnly && (c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways) {
				continue
			}
			for _, p := range c.Ports {
				pp := p.Protocol
				if pp == "" {
					pp = corev1.ProtocolTCP
				}
				if p.Name == name && pp == proto {
					return p.ContainerPort
				}
			}
		}
		return 0
	}
	if n := find(pod.Spec.Containers, false); n > 0 {
		return n
	}
	return find(pod.Spec.InitContainers, true)
}
