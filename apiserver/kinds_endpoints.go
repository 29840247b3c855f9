package apiserver

import (
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Endpoints and EndpointSlices print as kubectl shows them from kube-apiserver: at most three addresses, then
// "+ N more...".

const shownEndpoints = 3

var endpointsColumns = []column{
	nameColumn,
	{name: "Endpoints", typ: "string", value: func(o runtime.Object) interface{} {
		var shown []string
		total := 0
		for _, ss := range o.(*corev1.Endpoints).Subsets {
			for _, a := range ss.Addresses {
				for _, p := range portsOrNone(ss.Ports) {
					total++
					if len(shown) < shownEndpoints {
						shown = append(shown, a.IP+p)
					}
				}
			}
		}
		return moreOf(shown, total)
	}},
	ageColumn,
}

// portsOrNone are the ":port" suffixes of a subset's ports; a subset without ports shows bare addresses.
func portsOrNone(ports []corev1.EndpointPort) []string {
	if len(ports) == 0 {
		return []string{""}
	}
	out := make([]string, len(ports))
	for i, p := range ports {
		out[i] = ":" + strconv.Itoa(int(p.Port))
	}
	return out
}

var endpointSliceColumns = []column{
	nameColumn,
	{name: "AddressType", typ: "string", value: func(o runtime.Object) interface{} { return string(o.(*discoveryv1.EndpointSlice).AddressType) }},
	{name: "Ports", typ: "string", value: func(o runtime.Object) interface{} {
		var ports []string
		for _, p := range o.(*discoveryv1.EndpointSlice).Ports {
			if p.Port != nil {
				ports = append(ports, strconv.Itoa(int(*p.Port)))
			}
		}
		if len(ports) == 0 {
			return "<unset>"
		}
		return strings.Join(ports, ",")
	}},
	{name: "Endpoints", typ: "string", value: func(o runtime.Object) interface{} {
		var shown []string
		total := 0
		for _, ep := range o.(*discoveryv1.EndpointSlice).Endpoints {
			for _, a := range ep.Addresses {
				total++
				if len(shown) < shownEndpoints {
					shown = append(shown, a)
				}
			}
		}
		return moreOf(shown, total)
	}},
	ageColumn,
}

func moreOf(shown []string, total int) string {
	switch {
	case total == 0:
		return "<none>"
	case total > len(shown):
		return fmt.Sprintf("%s + %d more...", strings.Join(shown, ","), total-len(shown))
	}
	return strings.Join(shown, ",")
}
