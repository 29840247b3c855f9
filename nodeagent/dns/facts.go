package dns

import (
	"fmt"
	"net"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// The ConfigMap in which the servers publish the cluster's network facts, and its keys.
const (
	FactsNamespace = "kube-system"
	FactsName      = "skiff-cluster"

	keyClusterDNS    = "clusterDNS"
	keyClusterDomain = "clusterDomain"
	keyServiceCIDR   = "serviceCIDR"
	keyClusterCIDR   = "clusterCIDR"
)

// Facts are the cluster facts an agent needs for DNS: the kube-dns Service's address and the domain.
type Facts struct {
	ClusterDNS    string // IPv4 address, e.g. 10.96.0.10
	ClusterDomain string // no trailing dot, e.g. cluster.local
	ServiceCIDR   string
	ClusterCIDR   string
}

// FactsFrom reads the skiff-cluster ConfigMap. A missing or malformed clusterDNS or clusterDomain is an
// error: an agent must not hand pods a nameserver it cannot trust.
func FactsFrom(cm *corev1.ConfigMap) (Facts, error) {
	f := Facts{
		ClusterDNS:    strings.TrimSpace(cm.Data[keyClusterDNS]),
		ClusterDomain: strings.TrimSuffix(strings.TrimSpace(cm.Data[keyClusterDomain]), "."),
		ServiceCIDR:   cm.Data[keyServiceCIDR],
		ClusterCIDR:   cm.Data[keyClusterCIDR],
	}
	if ip := net.ParseIP(f.ClusterDNS); ip == nil || ip.To4() == nil {
		return Facts{}, fmt.Errorf("%s/%s: %s %q is not an IPv4 address", cm.Namespace, cm.Name, keyClusterDNS, f.ClusterDNS)
	}
	if f.ClusterDomain == "" {
		return Facts{}, fmt.Errorf("%s/%s: %s is empty", cm.Namespace, cm.Name, keyClusterDomain)
	}
	return f, nil
}
