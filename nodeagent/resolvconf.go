package nodeagent

import (
	"bufio"
	"bytes"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// hostResolvConfPath is the node's resolver configuration, which Default pods get and ClusterFirst pods
// take their extra search domains from.
const hostResolvConfPath = "/etc/resolv.conf"

// The kubelet's limits on a pod's resolv.conf (pkg/kubelet/network/dns): glibc reads at most three
// nameservers; search paths are capped at 32 domains and 2048 characters.
const (
	maxDNSNameservers    = 3
	maxDNSSearches       = 32
	maxDNSSearchListChar = 2048
)

// clusterDNS is the cluster DNS Service's address and the cluster domain; zero until the agent knows them
// (the servers publish them in kube-system/skiff-cluster).
type clusterDNS struct {
	IP, Domain string
	// ServiceCIDR holds the kubernetes Service's ClusterIP (its first address), for the pods' service variables.
	ServiceCIDR string
}

// resolvConf is the part of a resolv.conf a pod's DNS is built from.
type resolvConf struct {
	nameservers, searches, options []string
}

// parseResolvConf reads nameserver, search (or domain) and options lines; later search lines replace
// earlier ones, as in glibc.
func parseResolvConf(data []byte) resolvConf {
	var rc resolvConf
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		if i := strings.IndexAny(line, "#;"); i >= 0 {
			line = line[:i]
		}
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		switch fields[0] {
		case "nameserver":
			rc.nameservers = append(rc.nameservers, fields[1])
		case "search", "domain":
			rc.searches = nil
			for _, s := range fields[1:] {
				if s = strings.TrimSuffix(s, "."); s != "" {
					rc.searches = append(rc.searches, s)
				}
			}
		case "options":
			rc.options = append(rc.options, fields[1:]...)
		}
	}
	return rc
}

// String renders the file as the kubelet writes it.
func (rc resolvConf) String() string {
	var b strings.Builder
	for _, ns := range rc.nameservers {
		b.WriteString("nameserver " + ns + "\n")
	}
	if len(rc.searches) > 0 {
		b.WriteString("search " + strings.Join(rc.searches, " ") + "\n")
	}
	if len(rc.options) > 0 {
		b.WriteString("options " + strings.Join(rc.options, " ") + "\n")
	}
	return b.String()
}

// podResolvConf is a pod's resolver configuration by the kubelet's rules:
//   - ClusterFirst (the default): the cluster DNS, the search path <ns>.svc.<domain> svc.<domain> <domain>
//     followed by the node's search domains, and ndots:5; a hostNetwork pod gets Default instead;
//   - ClusterFirstWithHostNet: the cluster DNS, hostNetwork or not;
//   - Default: the node's resolv.conf;
//   - None: nothing but dnsConfig.
//
// While the cluster DNS is not known, the cluster policies fall back to Default, as the kubelet does without
// clusterDNS. dnsConfig is then merged in: nameservers and searches appended without duplicates, options
// merged by name with dnsConfig's values winning; and the kubelet's limits applied.
func podResolvConf(pod *corev1.Pod, host resolvConf, cluster clusterDNS) resolvConf {
	var rc resolvConf
	useCluster := false
	switch pod.Spec.DNSPolicy {
	case corev1.DNSClusterFirstWithHostNet:
		useCluster = true
	case corev1.DNSClusterFirst, "":
		useCluster = !pod.Spec.HostNetwork
	}
	switch {
	case pod.Spec.DNSPolicy == corev1.DNSNone:
	case useCluster && cluster.IP != "":
		rc.nameservers = []string{cluster.IP}
		if d := cluster.Domain; d != "" {
			rc.searches = []string{pod.Namespace + ".svc." + d, "svc." + d, d}
		}
		rc.searches = append(rc.searches, host.searches...)
		rc.options = []string{"ndots:5"}
	default:
		rc = resolvConf{nameservers: slices.Clone(host.nameservers), searches: slices.Clone(host.searches), options: slices.Clone(host.options)}
	}
	if cfg := pod.Spec.DNSConfig; cfg != nil {
		rc.nameservers = appendNew(rc.nameservers, cfg.Nameservers...)
		rc.searches = appendNew(rc.searches, cfg.Searches...)
		rc.options = mergeDNSOptions(rc.options, cfg.Options)
	}
	rc.searches = appendNew(nil, rc.searches...) // the node's domains may repeat the cluster's
	if len(rc.nameservers) > maxDNSNameservers {
		rc.nameservers = rc.nameservers[:maxDNSNameservers]
	}
	if len(rc.searches) > maxDNSSearches {
		rc.searches = rc.searches[:maxDNSSearches]
	}
	for len(rc.searches) > 0 && len(strings.Join(rc.searches, " ")) > maxDNSSearchListChar {
		rc.searches = rc.searches[:len(rc.searches)-1]
	}
	return rc
}

// appendNew appends the values not already in list, keeping the first of each.
func appendNew(list []string, values ...string) []string {
	for _, v := range values {
		if !slices.Contains(list, v) {
			list = append(list, v)
		}
	}
	return list
}

// mergeDNSOptions merges dnsConfig options into "name" or "name:value" options: an option of the same name
// is replaced in place, a new one appended.
func mergeDNSOptions(existing []string, extra []corev1.PodDNSConfigOption) []string {
	out := slices.Clone(existing)
	for _, o := range extra {
		opt := o.Name
		if o.Value != nil {
			opt += ":" + *o.Value
		}
		i := slices.IndexFunc(out, func(s string) bool { name, _, _ := strings.Cut(s, ":"); return name == o.Name })
		if i >= 0 {
			out[i] = opt
		} else {
			out = append(out, opt)
		}
	}
	return out
}

// clusterDNS is the cluster DNS as the agent knows it now.
func (r *containerdRuntime) clusterDNS() clusterDNS {
	if r.dnsFacts == nil {
		return clusterDNS{}
	}
	return r.dnsFacts()
}
