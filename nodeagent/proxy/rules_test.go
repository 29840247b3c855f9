package proxy

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

const testID = "0000abcd"

func testFacts() NodeFacts {
	return NodeFacts{ID: testID, Owner: OwnerComment(testID, "/var/lib/skiff"), NodeName: "node-a", PodCIDR: "10.244.0.0/24", SCTP: true}
}

// service is a Service with one port 80 -> 8080 on clusterIP; opts adjust it.
func service(name, clusterIP string, opts ...func(*corev1.Service)) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("uid-" + name)},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: clusterIP,
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP}}},
	}
	for _, o := range opts {
		o(svc)
	}
	return svc
}

func nodePort(port int32) func(*corev1.Service) {
	return func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort; s.Spec.Ports[0].NodePort = port }
}

func protocol(p corev1.Protocol) func(*corev1.Service) {
	return func(s *corev1.Service) { s.Spec.Ports[0].Protocol = p }
}

// ep is an endpoint address on a node; conditions default to ready.
type ep struct {
	ip, node                    string
	notReady, serving, terminal bool
}

// slice is an EndpointSlice of the Service's "http" TCP port 8080 with eps.
func slice(svc string, eps ...ep) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Namespace: "default", Name: svc + "-abc", UID: types.UID("slice-" + svc), Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("http"), Port: ptr.To[int32](8080), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	for _, e := range eps {
		s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{Addresses: []string{e.ip}, NodeName: ptr.To(e.node),
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(!e.notReady), Serving: ptr.To(!e.notReady || e.serving), Terminating: ptr.To(e.terminal)}})
	}
	return s
}

func TestBuildRules(t *testing.T) {
	n := namesFor(testID)
	svcChain := func(svc string) string { return n.hashedChain(n.servicePfx, testID, "default/"+svc+":http", "tcp") }
	epChain := func(svc, hostPort string) string {
		return n.hashedChain(n.endpointPfx, testID, "default/"+svc+":http", "tcp", hostPort)
	}
	cases := []struct {
		name     string
		services []*corev1.Service
		slices   []*discoveryv1.EndpointSlice
		facts    func(*NodeFacts)
		want     []string // lines (or parts of lines) that must be present
		absent   []string
		problems []string // reasons, in order
	}{{
		name:     "clusterIP balances across ready endpoints, last one unconditional",
		services: []*corev1.Service{service("web", "10.96.0.10")},
		slices:   []*discoveryv1.EndpointSlice{slice("web", ep{ip: "10.244.0.5", node: "node-a"}, ep{ip: "10.244.1.5", node: "node-b"}, ep{ip: "10.244.2.5", node: "node-c", notReady: true})},
		want: []string{
			"-A SKIFF-0000abcd-SVCS -m comment --comment \"default/web:http\" ! -s 10.244.0.0/24 -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j SKIFF-0000abcd-MARK-MASQ",
			"-A SKIFF-0000abcd-SVCS -m comment --comment \"default/web:http\" -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j " + svcChain("web"),
			"-A " + svcChain("web") + " -m comment --comment \"default/web:http\" -m statistic --mode random --probability 0.5000000000 -j " + epChain("web", "10.244.0.5:8080"),
			"-A " + svcChain("web") + " -m comment --comment \"default/web:http\" -j " + epChain("web", "10.244.1.5:8080"),
			"-A " + epChain("web", "10.244.0.5:8080") + " -m comment --comment \"default/web:http\" -s 10.244.0.5/32 -j SKIFF-0000abcd-MARK-MASQ",
			"-p tcp -m tcp -j DNAT --to-destination 10.244.0.5:8080",
			"-A SKIFF-0000abcd-SVCS -m comment --comment \"node ports\" -m addrtype --dst-type LOCAL -j SKIFF-0000abcd-NODEPORTS",
			"-A SKIFF-0000abcd-POSTRTG -j MASQUERADE\n",
		},
		absent: []string{"10.244.2.5", "REJECT"},
	}, {
		name:     "no endpoints: REJECT in filter, no nat rule",
		services: []*corev1.Service{service("web", "10.96.0.10", nodePort(30080))},
		want: []string{
			"-A SKIFF-0000abcd-FILTER -m comment --comment \"default/web:http\" -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable",
			"-A SKIFF-0000abcd-FILTER -m comment --comment \"default/web:http\" -m addrtype --dst-type LOCAL -p tcp -m tcp --dport 30080 -j REJECT",
		},
		absent: []string{"-j " + svcChain("web"), "DNAT"},
	}, {
		name:     "no ready endpoint: serving terminating ones are used",
		services: []*corev1.Service{service("web", "10.96.0.10")},
		slices:   []*discoveryv1.EndpointSlice{slice("web", ep{ip: "10.244.0.5", notReady: true, serving: true, terminal: true}, ep{ip: "10.244.0.6", notReady: true, terminal: true})},
		want:     []string{"--to-destination 10.244.0.5:8080"},
		absent:   []string{"10.244.0.6", "REJECT"},
	}, {
		name:     "a ready endpoint wins over terminating ones",
		services: []*corev1.Service{service("web", "10.96.0.10")},
		slices:   []*discoveryv1.EndpointSlice{slice("web", ep{ip: "10.244.0.5", notReady: true, serving: true, terminal: true}, ep{ip: "10.244.0.7"})},
		want:     []string{"--to-destination 10.244.0.7:8080"},
		absent:   []string{"10.244.0.5"},
	}, {
		name:     "nodePort with externalTrafficPolicy Cluster is masqueraded",
		services: []*corev1.Service{service("web", "10.96.0.10", nodePort(30080))},
		slices:   []*discoveryv1.EndpointSlice{slice("web", ep{ip: "10.244.1.5", node: "node-b"})},
		want: []string{
			"-A SKIFF-0000abcd-NODEPORTS -m comment --comment \"default/web:http\" -p tcp -m tcp --dport 30080 -j SKIFF-0000abcd-MARK-MASQ",
			"-A SKIFF-0000abcd-NODEPORTS -m comment --comment \"default/web:http\" -p tcp -m tcp --dport 30080 -j " + svcChain("web"),
		},
	}, {
		name: "externalTrafficPolicy Local: local endpoints only, source kept, DROP when none local",
		services: []*corev1.Service{service("web", "10.96.0.10", nodePort(30080), func(s *corev1.Service) {
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		})},
		slices: []*discoveryv1.EndpointSlice{slice("web", ep{ip: "10.244.1.5", node: "node-b"})},
		want: []string{
			"-A SKIFF-0000abcd-FILTER -m comment --comment \"default/web:http\" -m addrtype --dst-type LOCAL -p tcp -m tcp --dport 30080 -j DROP",
			"-m addrtype --src-type LOCAL -j " + svcChain("web"),
			"-s 10.244.0.0/24 -j " + svcChain("web"),
		},
		absent: []string{"--dport 30080 -j SKIFF-0000abcd-MARK-MASQ"},
	}, {
		name: "internalTrafficPolicy Local: only this node's endpoints",
		services: []*corev1.Service{service("web", "10.96.0.10", func(s *corev1.Service) {
			s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
		})},
		slices: []*discoveryv1.EndpointSlice{slice("web", ep{ip: "10.244.0.5", node: "node-a"}, ep{ip: "10.244.1.5", node: "node-b"})},
		want:   []string{n.hashedChain(n.localPfx, testID, "default/web:http", "tcp") + " -m comment --comment \"default/web:http\" -j " + epChain("web", "10.244.0.5:8080")},
		absent: []string{"-j " + svcChain("web") + "\n"},
	}, {
		name: "internalTrafficPolicy Local without local endpoints drops",
		services: []*corev1.Service{service("web", "10.96.0.10", func(s *corev1.Service) {
			s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
		})},
		slices: []*discoveryv1.EndpointSlice{slice("web", ep{ip: "10.244.1.5", node: "node-b"})},
		want:   []string{"--dport 80 -j DROP"},
		absent: []string{"-A SKIFF-0000abcd-SVCS -m comment --comment \"default/web:http\" -d"},
	}, {
		name: "sessionAffinity ClientIP with its timeout",
		services: []*corev1.Service{service("web", "10.96.0.10", func(s *corev1.Service) {
			s.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			s.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](60)}}
		})},
		slices: []*discoveryv1.EndpointSlice{slice("web", ep{ip: "10.244.0.5"})},
		want: []string{
			"-m recent --name " + epChain("web", "10.244.0.5:8080") + " --rcheck --seconds 60 --reap -j " + epChain("web", "10.244.0.5:8080"),
			"-p tcp -m tcp -m recent --name " + epChain("web", "10.244.0.5:8080") + " --set -j DNAT",
		},
	}, {
		name:     "SCTP without kernel support: that port skipped with an event, others kept",
		services: []*corev1.Service{service("sctp", "10.96.0.11", protocol(corev1.ProtocolSCTP)), service("web", "10.96.0.10")},
		facts:    func(f *NodeFacts) { f.SCTP = false },
		want:     []string{"-d 10.96.0.10/32"},
		absent:   []string{"10.96.0.11"},
		problems: []string{ReasonUnsupportedProtocol},
	}, {
		name:     "SCTP with kernel support",
		services: []*corev1.Service{service("sctp", "10.96.0.11", protocol(corev1.ProtocolSCTP))},
		want:     []string{"-d 10.96.0.11/32 -p sctp -m sctp --dport 80 -j REJECT"},
	}, {
		name: "NodePort clash: the older Service keeps it, the other keeps its ClusterIP",
		services: []*corev1.Service{
			service("young", "10.96.0.12", nodePort(30080), func(s *corev1.Service) { s.CreationTimestamp = metav1.Unix(200, 0) }),
			service("old", "10.96.0.11", nodePort(30080), func(s *corev1.Service) { s.CreationTimestamp = metav1.Unix(100, 0) }),
		},
		want:     []string{"\"default/old:http\" -m addrtype --dst-type LOCAL -p tcp -m tcp --dport 30080 -j REJECT", "-d 10.96.0.12/32"},
		absent:   []string{"\"default/young:http\" -m addrtype --dst-type LOCAL"},
		problems: []string{ReasonNodePortClash},
	}, {
		name:     "malformed slice: bad address and missing port number skipped with an event",
		services: []*corev1.Service{service("web", "10.96.0.10"), service("db", "10.96.0.20")},
		slices: []*discoveryv1.EndpointSlice{
			slice("web", ep{ip: "not-an-ip"}, ep{ip: "10.244.0.5"}),
			func() *discoveryv1.EndpointSlice {
				s := slice("db", ep{ip: "10.244.0.9"})
				s.Ports[0].Port = nil
				return s
			}(),
		},
		want:     []string{"--to-destination 10.244.0.5:8080", "-d 10.96.0.20/32 -p tcp -m tcp --dport 80 -j REJECT"},
		absent:   []string{"not-an-ip", "10.244.0.9"},
		problems: []string{ReasonMalformedSlice, ReasonMalformedSlice},
	}, {
		name: "externalIPs: translated and masqueraded like a NodePort, on every node",
		services: []*corev1.Service{service("web", "10.96.0.10", func(s *corev1.Service) {
			s.Spec.ExternalIPs = []string{"192.0.2.7"}
		})},
		slices: []*discoveryv1.EndpointSlice{slice("web", ep{ip: "10.244.1.5", node: "node-b"})},
		want: []string{
			"-A SKIFF-0000abcd-SVCS -m comment --comment \"default/web:http\" -d 192.0.2.7/32 -p tcp -m tcp --dport 80 -j SKIFF-0000abcd-MARK-MASQ",
			"-A SKIFF-0000abcd-SVCS -m comment --comment \"default/web:http\" -d 192.0.2.7/32 -p tcp -m tcp --dport 80 -j " + svcChain("web"),
		},
	}, {
		name:     "externalIPs without endpoints: REJECT",
		services: []*corev1.Service{service("web", "10.96.0.10", func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"192.0.2.7"} })},
		want:     []string{"-A SKIFF-0000abcd-FILTER -m comment --comment \"default/web:http\" -d 192.0.2.7/32 -p tcp -m tcp --dport 80 -j REJECT"},
		absent:   []string{"-A SKIFF-0000abcd-SVCS -m comment --comment \"default/web:http\" -d 192.0.2.7"},
	}, {
		name: "a load balancer's address, with externalTrafficPolicy Local: local endpoints, DROP where none",
		services: []*corev1.Service{service("web", "10.96.0.10", nodePort(30080), func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.4"}, {IP: "198.51.100.5", IPMode: ptr.To(corev1.LoadBalancerIPModeProxy)}, {Hostname: "lb.example"}}
		})},
		slices: []*discoveryv1.EndpointSlice{slice("web", ep{ip: "10.244.1.5", node: "node-b"})},
		want: []string{
			"-A SKIFF-0000abcd-SVCS -m comment --comment \"default/web:http\" -d 198.51.100.4/32 -p tcp -m tcp --dport 80 -j " + n.hashedChain(n.externalPfx, testID, "default/web:http", "tcp"),
			"-A SKIFF-0000abcd-FILTER -m comment --comment \"default/web:http\" -d 198.51.100.4/32 -p tcp -m tcp --dport 80 -j DROP",
			"--dport 30080 -j DROP",
		},
		absent: []string{"198.51.100.5", "-d 198.51.100.4/32 -p tcp -m tcp --dport 80 -j SKIFF-0000abcd-MARK-MASQ"},
	}, {
		name: "loadBalancerSourceRanges: only those sources are translated, the rest dropped",
		services: []*corev1.Service{service("web", "10.96.0.10", nodePort(30080), func(s *corev1.Service) {
			s.Spec.Type = corev1.ServiceTypeLoadBalancer
			s.Spec.LoadBalancerSourceRanges = []string{"203.0.113.0/24", " 10.0.0.0/8"}
			s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.4"}}
		})},
		slices: []*discoveryv1.EndpointSlice{slice("web", ep{ip: "10.244.1.5", node: "node-b"})},
		want: []string{
			"-A SKIFF-0000abcd-SVCS -m comment --comment \"default/web:http\" -s 203.0.113.0/24 -d 198.51.100.4/32 -p tcp -m tcp --dport 80 -j " + svcChain("web"),
			"-A SKIFF-0000abcd-SVCS -m comment --comment \"default/web:http\" -s 10.0.0.0/8 -d 198.51.100.4/32 -p tcp -m tcp --dport 80 -j " + svcChain("web"),
			"-A SKIFF-0000abcd-FILTER -m comment --comment \"default/web:http\" -d 198.51.100.4/32 -p tcp -m tcp --dport 80 -j DROP",
		},
		absent: []string{"-A SKIFF-0000abcd-SVCS -m comment --comment \"default/web:http\" -d 198.51.100.4/32"},
	}, {
		name:     "headless and ExternalName Services have no rules",
		services: []*corev1.Service{service("headless", corev1.ClusterIPNone), service("ext", "", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeExternalName })},
		absent:   []string{"headless", "default/ext"},
	}, {
		name:     "chains that exist but are no longer wanted are deleted in the same transaction",
		services: []*corev1.Service{},
		facts: func(f *NodeFacts) {
			f.Existing = map[string][]string{"nat": {"SKIFF-0000abcd-SVCS", "SKIFF-0000abcd-S-GONEGONEGON"}}
		},
		want:   []string{":SKIFF-0000abcd-S-GONEGONEGON - [0:0]", "-X SKIFF-0000abcd-S-GONEGONEGON\nCOMMIT"},
		absent: []string{"-X SKIFF-0000abcd-SVCS"},
	}, {
		name:     "random-fully when iptables has it",
		services: []*corev1.Service{},
		facts:    func(f *NodeFacts) { f.RandomFully = true },
		want:     []string{"-j MASQUERADE --random-fully"},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			facts := testFacts()
			if tc.facts != nil {
				tc.facts(&facts)
			}
			rs := BuildRules(tc.services, tc.slices, facts)
			text := string(rs.Restore)
			for _, w := range tc.want {
				if !strings.Contains(text, w) {
					t.Errorf("missing %q in:\n%s", w, text)
				}
			}
			for _, a := range tc.absent {
				if strings.Contains(text, a) {
					t.Errorf("unexpected %q in:\n%s", a, text)
				}
			}
			var reasons []string
			for _, p := range rs.Problems {
				reasons = append(reasons, p.Reason)
			}
			if fmt.Sprint(reasons) != fmt.Sprint(tc.problems) && !(len(reasons) == 0 && len(tc.problems) == 0) {
				t.Errorf("problems %v, want %v", rs.Problems, tc.problems)
			}
			for _, table := range rs.Chains {
				for _, c := range table {
					if len(c) > maxChainLen {
						t.Errorf("chain %q is longer than %d bytes", c, maxChainLen)
					}
				}
			}
		})
	}
}

func TestChainOwnerID(t *testing.T) {
	for chain, want := range map[string]string{
		"SKIFF-0000abcd-SVCS": "0000abcd", "SKIFF-0000abcd-S-ABCDEFGHIJK": "0000abcd", "SKIFF-MASQ-0000abcd": "0000abcd", "SKIFF-NP-0000abcd-FWD": "0000abcd",
		"KUBE-SERVICES": "", "SKIFF-SHORT": "", "SKIFF-0000abcdX": "", "DOCKER": "",
	} {
		if got := chainOwnerID(chain); got != want {
			t.Errorf("chainOwnerID(%q) = %q, want %q", chain, got, want)
		}
	}
}

func TestOwnerComment(t *testing.T) {
	for _, tc := range []struct{ id, dir, wantDir string }{
		{"0000abcd", "/var/lib/skiff", "/var/lib/skiff"},
		{"0000abcd", "/tmp/with space", "/tmp/with space"},
		{"0000abcd", `/tmp/quo"te`, ""},
		{"0000abcd", "/" + strings.Repeat("x", 300), ""},
	} {
		id, dir, ok := ParseOwnerComment(OwnerComment(tc.id, tc.dir))
		if !ok || id != tc.id || dir != tc.wantDir {
			t.Errorf("OwnerComment(%q, %q) reads back as %q, %q, %v", tc.id, tc.dir, id, dir, ok)
		}
		r := savedRule{spec: `-m comment --comment "` + OwnerComment(tc.id, tc.dir) + `" -j X`}
		if r.comment() != OwnerComment(tc.id, tc.dir) || r.target() != "X" {
			t.Errorf("saved rule reads comment %q target %q", r.comment(), r.target())
		}
	}
}

// A sync that knows the previous one writes only the chains of changed service ports, and keeps the others
// declared (so they are not deleted as stale).
func TestBuildRulesPartial(t *testing.T) {
	services := []*corev1.Service{service("web", "10.96.0.10"), service("db", "10.96.0.20")}
	first := BuildRules(services, []*discoveryv1.EndpointSlice{slice("web", ep{ip: "10.244.0.5"}), slice("db", ep{ip: "10.244.0.9"})}, testFacts())
	facts := testFacts()
	facts.Previous, facts.Existing = first.PortHashes, first.Chains
	second := BuildRules(services, []*discoveryv1.EndpointSlice{slice("web", ep{ip: "10.244.0.6"}), slice("db", ep{ip: "10.244.0.9"})}, facts)
	text := string(second.Restore)
	if second.Written != 1 || !strings.Contains(text, "10.244.0.6:8080") || strings.Contains(text, "10.244.0.9:8080") {
		t.Fatalf("wrote %d service ports:\n%s", second.Written, text)
	}
	n := namesFor(testID)
	dbChain := n.hashedChain(n.servicePfx, testID, "default/db:http", "tcp")
	oldWeb := n.hashedChain(n.endpointPfx, testID, "default/web:http", "tcp", "10.244.0.5:8080")
	if strings.Contains(text, "-X "+dbChain) || !strings.Contains(text, "-X "+oldWeb) {
		t.Fatalf("deletions wrong:\n%s", text)
	}
	if !strings.Contains(text, "-d 10.96.0.20/32 -p tcp -m tcp --dport 80 -j "+dbChain) {
		t.Fatalf("the services chain must still jump to the unchanged chain:\n%s", text)
	}
}

// The fingerprint names the rules a restore leaves, however much of them it writes: a partial sync after a
// full one with no change has the full one's fingerprint (so nothing is restored), a change alters it.
func TestFingerprintIgnoresHowMuchIsWritten(t *testing.T) {
	services := []*corev1.Service{service("web", "10.96.0.10"), service("db", "10.96.0.20")}
	slices := []*discoveryv1.EndpointSlice{slice("web", ep{ip: "10.244.0.5"}), slice("db", ep{ip: "10.244.0.9"})}
	full := BuildRules(services, slices, testFacts())
	facts := testFacts()
	facts.Previous, facts.Existing = full.PortHashes, full.Chains
	partial := BuildRules(services, slices, facts)
	if partial.Written != 0 || partial.Fingerprint != full.Fingerprint || bytes.Equal(partial.Restore, full.Restore) {
		t.Fatalf("no change: wrote %d ports, same fingerprint %v, same text %v", partial.Written,
			partial.Fingerprint == full.Fingerprint, bytes.Equal(partial.Restore, full.Restore))
	}
	changed := BuildRules(services, []*discoveryv1.EndpointSlice{slice("web", ep{ip: "10.244.0.6"}), slices[1]}, facts)
	if changed.Fingerprint == full.Fingerprint {
		t.Fatal("an endpoint change kept the fingerprint")
	}
	gone := BuildRules(services[:1], slices[:1], facts)
	if gone.Fingerprint == full.Fingerprint {
		t.Fatal("a deleted Service kept the fingerprint")
	}
}

// Restores are paced at one per interval on average, with a burst of two.
func TestWriteBucket(t *testing.T) {
	t0 := time.Unix(1000, 0)
	b := newWriteBucket(time.Second, t0)
	for i := range 2 {
		if w := b.wait(t0); w != 0 {
			t.Fatalf("write %d of the burst waits %v", i, w)
		}
		b.take(t0)
	}
	if w := b.wait(t0); w != time.Second {
		t.Fatalf("the third write at once waits %v, want 1s", w)
	}
	if w := b.wait(t0.Add(400 * time.Millisecond)); w != 600*time.Millisecond {
		t.Fatalf("400ms later it waits %v, want 600ms", w)
	}
	if w := b.wait(t0.Add(10 * time.Second)); w != 0 {
		t.Fatalf("after a quiet spell it waits %v", w)
	}
}
