package netpol

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func newPod(ns, name, ip, node string, lbls map[string]string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name), Labels: lbls},
		Spec:   corev1.PodSpec{NodeName: node},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip}}
}

func build(policies []*networkingv1.NetworkPolicy, pods ...*corev1.Pod) *Ruleset {
	return Build(Input{ID: "0000abcd", Owner: "skiff:0000abcd:/d", Policies: policies, Pods: pods,
		Namespaces: []*corev1.Namespace{namespace("a", nil), namespace("b", map[string]string{"env": "prod"})},
		Local:      func(p *corev1.Pod) bool { return p.Spec.NodeName == "n1" }})
}

// TestBuildRules checks the rules and sets of policies of each shape, as text: what the kernel makes of them
// is TestPoliciesInTheKernel's.
func TestBuildRules(t *testing.T) {
	udp, sctp := corev1.ProtocolUDP, corev1.ProtocolSCTP
	server := newPod("a", "server", "10.1.0.2", "n1", map[string]string{"app": "server"})
	elsewhere := newPod("a", "remote", "10.2.0.2", "n2", map[string]string{"app": "server"})
	client := newPod("b", "client", "10.2.0.3", "n2", map[string]string{"app": "client"})
	done := newPod("b", "done", "10.2.0.4", "n2", map[string]string{"app": "client"})
	done.Status.Phase = corev1.PodSucceeded
	hostNet := newPod("b", "hostnet", "192.0.2.1", "n2", map[string]string{"app": "client"})
	hostNet.Spec.HostNetwork = true
	pol := func(spec networkingv1.NetworkPolicySpec) *networkingv1.NetworkPolicy {
		return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "p"}, Spec: spec}
	}
	cases := []struct {
		name      string
		policy    *networkingv1.NetworkPolicy
		want, not []string
		sets      []string // entries of every set, joined with ","
	}{{
		name:   "no policy types and no egress rules: ingress only, default deny",
		policy: pol(networkingv1.NetworkPolicySpec{}),
		want:   []string{"-d 10.1.0.2/32 -j SKIFF-NP-0000abcd-I", `--comment "ingress of a/server" -j REJECT`},
		not:    []string{"-s 10.1.0.2/32", "10.2.0.2/32"},
	}, {
		name: "namespace selector: only running pods off the host network",
		policy: pol(networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"env": "prod"}}}},
			Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: ptr(intstr.FromInt32(53))}, {Protocol: &sctp}},
		}}}),
		want: []string{"src -p udp -m udp --dport 53 -j RETURN", "src -p sctp -j RETURN"},
		sets: []string{"10.2.0.3"},
	}, {
		name: "ipBlock of everything with an except, egress by default type list",
		policy: pol(networkingv1.NetworkPolicySpec{Egress: []networkingv1.NetworkPolicyEgressRule{{
			To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0", Except: []string{"10.2.0.0/16"}}},
				{IPBlock: &networkingv1.IPBlock{CIDR: "fd00::/8"}}},
		}}}),
		want: []string{"-s 10.1.0.2/32 -j SKIFF-NP-0000abcd-E", "-d 10.1.0.2/32 -j SKIFF-NP-0000abcd-I", "dst -j RETURN"},
		sets: []string{"0.0.0.0/1,10.2.0.0/16 nomatch,128.0.0.0/1"},
	}, {
		name: "a named port the pod lacks allows nothing",
		policy: pol(networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{
			Ports: []networkingv1.NetworkPolicyPort{{Port: ptr(intstr.FromString("grpc"))}},
		}}}),
		not: []string{"RETURN"},
	}, {
		name: "port range",
		policy: pol(networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{
			Ports: []networkingv1.NetworkPolicyPort{{Port: ptr(intstr.FromInt32(8000)), EndPort: ptr(int32(8080))}},
		}}}),
		want: []string{"-p tcp -m tcp --dport 8000:8080 -j RETURN"},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rs := build([]*networkingv1.NetworkPolicy{c.policy}, server, elsewhere, client, done, hostNet)
			text := string(rs.Restore)
			for _, w := range c.want {
				if !strings.Contains(text, w) {
					t.Errorf("no %q in\n%s", w, text)
				}
			}
			for _, n := range c.not {
				if strings.Contains(text, n) {
					t.Errorf("%q in\n%s", n, text)
				}
			}
			var sets []string
			for _, s := range rs.Sets {
				if len(s.Name) > maxSetLen {
					t.Errorf("set name %s too long", s.Name)
				}
				sets = append(sets, strings.Join(s.Entries, ","))
			}
			if c.sets != nil && strings.Join(sets, " ") != strings.Join(c.sets, " ") {
				t.Errorf("sets %q, want %q", sets, c.sets)
			}
			for _, ch := range rs.Chains {
				if len(ch) > maxChainLen {
					t.Errorf("chain name %s too long", ch)
				}
			}
			if rs.Isolated != 1 {
				t.Errorf("%d isolated pods, want 1 (the remote pod is another node's)", rs.Isolated)
			}
			if again := build([]*networkingv1.NetworkPolicy{c.policy}, hostNet, done, client, elsewhere, server); again.Fingerprint != rs.Fingerprint {
				t.Error("the pods' order changed the rules")
			}
		})
	}
	if rs := build(nil, server, client); rs.Isolated != 0 || strings.Contains(string(rs.Restore), "-j SKIFF-NP-0000abcd-I") {
		t.Errorf("rules with no policy:\n%s", rs.Restore)
	}
}
