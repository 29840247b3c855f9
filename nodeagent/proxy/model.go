package proxy

import (
	"fmt"
	"net"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Problem is an object the proxy could not program, or programmed only in part; the agent reports it as a
// Warning event on the object.
type Problem struct {
	Object  runtime.Object
	Reason  string
	Message string
}

// Event reasons.
const (
	ReasonUnsupportedProtocol = "UnsupportedProtocol"
	ReasonNodePortClash       = "NodePortClash"
	ReasonBadClusterIP        = "UnsupportedClusterIP"
	ReasonMalformedSlice      = "MalformedEndpointSlice"
)

// endpoint is one usable backend of a service port, as read from an EndpointSlice.
type endpoint struct {
	ip                          string
	port                        int32
	node                        string
	ready, serving, terminating bool
}

func (e endpoint) hostPort() string { return net.JoinHostPort(e.ip, fmt.Sprint(e.port)) }

// slicePortKey names a service port in EndpointSlices: its name and protocol.
type slicePortKey struct {
	name     string
	protocol corev1.Protocol
}

// endpointIndex holds, per Service (namespace/name), the endpoints of each port found in its slices.
type endpointIndex map[string]map[slicePortKey][]endpoint

// indexSlices reads the slices, skipping (with a Problem) what is malformed: a port without a number, an
// address that is not IPv4. Slices of other address families (IPv6, FQDN) are not this proxy's and are
// ignored quietly, as kube-proxy does.
func indexSlices(slices []*discoveryv1.EndpointSlice) (endpointIndex, []Problem) {
	index := endpointIndex{}
	var problems []Problem
	for _, slice := range slices {
		svc := slice.Labels[discoveryv1.LabelServiceName]
		if svc == "" || slice.AddressType != discoveryv1.AddressTypeIPv4 {
			continue
		}
		var faults []string
		key := slice.Namespace + "/" + svc
		ports := index[key]
		if ports == nil {
			ports = map[slicePortKey][]endpoint{}
			index[key] = ports
		}
		for i, p := range slice.Ports {
			if p.Port == nil || *p.Port < 1 || *p.Port > 65535 {
				faults = append(faults, fmt.Sprintf("ports[%d] has no valid port number", i))
				continue
			}
			k := slicePortKey{protocol: corev1.ProtocolTCP}
			if p.Name != nil {
				k.name = *p.Name
			}
			if p.Protocol != nil {
				k.protocol = *p.Protocol
			}
			for j, ep := range slice.Endpoints {
				if len(ep.Addresses) == 0 {
					faults = append(faults, fmt.Sprintf("endpoints[%d] has no address", j))
					continue
				}
				ip := net.ParseIP(ep.Addresses[0]).To4()
				if ip == nil {
					faults = append(faults, fmt.Sprintf("endpoints[%d] address %q is not IPv4", j, ep.Addresses[0]))
					continue
				}
				e := endpoint{ip: ip.String(), port: *p.Port, ready: true}
				if ep.NodeName != nil {
					e.node = *ep.NodeName
				}
				// Unset conditions mean ready and serving, as the API documents.
				if ep.Conditions.Ready != nil {
					e.ready = *ep.Conditions.Ready
				}
				e.serving = e.ready
				if ep.Conditions.Serving != nil {
					e.serving = *ep.Conditions.Serving
				}
				e.terminating = ep.Conditions.Terminating != nil && *ep.Conditions.Terminating
				ports[k] = append(ports[k], e)
			}
		}
		if len(faults) > 0 {
			faults = dedupe(faults)
			problems = append(problems, Problem{Object: slice, Reason: ReasonMalformedSlice,
				Message: "skipped by the service proxy: " + strings.Join(faults, "; ")})
		}
	}
	return index, problems
}

func dedupe(s []string) []string {
	seen := map[string]bool{}
	out := s[:0]
	for _, v := range s {
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

// usable picks the endpoints traffic may go to, as Kubernetes does since 1.26: the ready ones, or, when
// none is ready, the serving ones that are terminating (so a rolling update's last pods keep answering).
// Duplicates (one endpoint in two slices) count once; the order is stable, so the rules are too.
func usable(eps []endpoint, keep func(endpoint) bool) []endpoint {
	var ready, terminating []endpoint
	seen := map[string]bool{}
	for _, e := range eps {
		if !keep(e) || seen[e.hostPort()] {
			continue
		}
		seen[e.hostPort()] = true
		switch {
		case e.ready:
			ready = append(ready, e)
		case e.serving && e.terminating:
			terminating = append(terminating, e)
		}
	}
	out := ready
	if len(out) == 0 {
		out = terminating
	}
	sort.Slice(out, func(i, j int) bool { return out[i].hostPort() < out[j].hostPort() })
	return out
}
