package nodeagent

import (
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Each address has exactly one announcer among the alive nodes, all nodes agreeing; a dead node's addresses
// move and no other's do; with externalTrafficPolicy Local only nodes with a ready endpoint announce.
func TestAnnouncedBy(t *testing.T) {
	lb := func(name, ip string, local bool) *corev1.Service {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer}}
		svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: ip}}
		if local {
			svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		}
		return svc
	}
	var services []*corev1.Service
	for i := range 20 {
		services = append(services, lb("s"+string(rune('a'+i)), netip.AddrFrom4([4]byte{10, 10, 0, byte(i + 1)}).String(), false))
	}
	nodes := []string{"n1", "n2", "n3"}
	owners := func(alive map[string]bool) map[netip.Addr]string {
		out := map[netip.Addr]string{}
		for _, n := range nodes {
			if !alive[n] {
				continue
			}
			for _, a := range announcedBy(n, services, nil, alive) {
				if other, dup := out[a.ip]; dup {
					t.Fatalf("%s announced by %s and %s", a.ip, other, n)
				}
				out[a.ip] = n
			}
		}
		return out
	}
	all := owners(map[string]bool{"n1": true, "n2": true, "n3": true})
	if len(all) != 20 {
		t.Fatalf("%d of 20 addresses announced", len(all))
	}
	per := map[string]int{}
	for _, n := range all {
		per[n]++
	}
	if len(per) != 3 {
		t.Fatalf("addresses spread over %v, want all three nodes", per)
	}
	without := owners(map[string]bool{"n1": true, "n3": true})
	for ip, n := range all {
		if n != "n2" && without[ip] != n {
			t.Errorf("%s moved from %s to %s when n2 died", ip, n, without[ip])
		}
		if n == "n2" && without[ip] == "" {
			t.Errorf("%s, n2's, not taken over", ip)
		}
	}

	local := lb("local", "10.10.1.1", true)
	slice := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "local-x", Labels: map[string]string{discoveryv1.LabelServiceName: "local"}},
		Endpoints: []discoveryv1.Endpoint{{NodeName: ptr("n3"), Conditions: discoveryv1.EndpointConditions{Ready: ptr(true)}},
			{NodeName: ptr("n1"), Conditions: discoveryv1.EndpointConditions{Ready: ptr(false)}}}}
	alive := map[string]bool{"n1": true, "n2": true, "n3": true}
	for _, n := range nodes {
		got := announcedBy(n, []*corev1.Service{local}, []*discoveryv1.EndpointSlice{slice}, alive)
		if (len(got) == 1) != (n == "n3") {
			t.Errorf("Local: %s announces %v, want only n3 (the ready endpoint's node)", n, got)
		}
	}
}
