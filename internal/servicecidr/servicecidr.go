// Package servicecidr owns the one fact about the service CIDR that both the servers and the node agents
// derive from it: the ClusterIP of the kubernetes Service (default/kubernetes), its first address. The
// servers create that Service and name the address in the API's serving certificate; the agents give pods
// its KUBERNETES_SERVICE_* variables. It allocates nothing: ClusterIPs come from the API server.
package servicecidr

import (
	"fmt"
	"net"
)

// KubernetesServiceIP is the ClusterIP of default/kubernetes: the first address of serviceCIDR, an IPv4 CIDR
// ("10.96.0.0/16" gives 10.96.0.1), as kube-apiserver picks it. A CIDR that does not parse, is not IPv4 or
// has no address after its network address (a /32) is an error.
func KubernetesServiceIP(serviceCIDR string) (net.IP, error) {
	_, cidr, err := net.ParseCIDR(serviceCIDR)
	if err != nil {
		return nil, err
	}
	network := cidr.IP.To4()
	if network == nil {
		return nil, fmt.Errorf("service CIDR %q is not IPv4", serviceCIDR)
	}
	ip := make(net.IP, net.IPv4len)
	copy(ip, network)
	ip[3]++ // the network address of a prefix of /31 or shorter is even: no carry
	if !cidr.Contains(ip) {
		return nil, fmt.Errorf("service CIDR %q has no address for the kubernetes Service", serviceCIDR)
	}
	return ip, nil
}
