// Package netpolbench makes the NetworkPolicy benchmarks' cluster: pods, namespaces and policies in the
// shapes real policies take, at the size asked for. The engine's benchmark (nodeagent/netpol) and the
// end-to-end one through the API (bench) use the same objects.
package netpolbench

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The cluster's shape: its namespaces, nodes and apps.
const (
	Namespaces = 50
	Nodes      = 50
	apps       = 10
)

// Node is the name of node i.
func Node(i int) string { return fmt.Sprintf("node-%d", i) }

// Objects is pods pods in 50 namespaces on 50 nodes (node-0 has a fiftieth of them, from every namespace),
// each labelled with one of 10 apps and 2 tiers and with named container ports http (8080) and metrics
// (9090), and policies policies spread over the namespaces in four shapes, in turn: ingress from pods of the
// namespace on a named port; ingress from labelled namespaces' pods on a port range; egress to an ipBlock with
// an except, plus DNS; default deny. Every pod is selected by a few policies.
func Objects(policies, pods int) ([]*networkingv1.NetworkPolicy, []*corev1.Pod, []*corev1.Namespace) {
	var nss []*corev1.Namespace
	for i := range Namespaces {
		name := fmt.Sprintf("ns-%02d", i)
		nss = append(nss, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels: map[string]string{"kubernetes.io/metadata.name": name, "team": fmt.Sprintf("team-%d", i%5)}}})
	}
	var ps []*corev1.Pod
	for i := range pods {
		ip := fmt.Sprintf("10.%d.%d.%d", 100+i%Nodes, i/Nodes/250, i/Nodes%250+2)
		ps = append(ps, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns-%02d", i%Namespaces), Name: fmt.Sprintf("pod-%05d", i),
				UID:    types.UID(fmt.Sprintf("uid-%05d", i)),
				Labels: map[string]string{"app": fmt.Sprintf("app-%d", i/Namespaces%apps), "tier": fmt.Sprintf("tier-%d", i%2)}},
			Spec: corev1.PodSpec{NodeName: Node(i / 7 % Nodes), Containers: []corev1.Container{{Name: "c", Image: "example.com/app:1",
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}, {Name: "metrics", ContainerPort: 9090}}}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}},
		})
	}
	var pols []*networkingv1.NetworkPolicy
	udp, tcp := corev1.ProtocolUDP, corev1.ProtocolTCP
	port := func(p intstr.IntOrString) *intstr.IntOrString { return &p }
	for i := range policies {
		p := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns-%02d", i%Namespaces), Name: fmt.Sprintf("policy-%04d", i)},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": fmt.Sprintf("app-%d", i/Namespaces%apps)}}}}
		switch i % 4 {
		case 0:
			p.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
			p.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "tier-0"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: port(intstr.FromString("http"))}},
			}}
		case 1:
			end := int32(8999)
			p.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
			p.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": fmt.Sprintf("team-%d", i%5)}},
					PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "tier-1"}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: port(intstr.FromInt32(8000)), EndPort: &end}},
			}}
		case 2:
			p.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
			p.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{
				{To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{fmt.Sprintf("10.%d.0.0/16", 100+i%Nodes)}}}}},
				{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: port(intstr.FromInt32(53))}}},
			}
		case 3:
			p.Spec.PodSelector = metav1.LabelSelector{}
			p.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
		}
		pols = append(pols, p)
	}
	return pols, ps, nss
}
