package dns

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// The kube-dns Service the servers create, and the label the agents' slices carry.
const (
	ServiceNamespace = "kube-system"
	ServiceName      = "kube-dns"
	// ManagedBy marks the slices agents write, so that the EndpointSlice controller (which leaves
	// selectorless Services' slices alone) and people can tell them apart.
	ManagedBy = "skiff-agent"
)

// SliceName is the name of a node's kube-dns EndpointSlice.
func SliceName(node string) string { return ServiceName + "-" + node }

// Slice is the EndpointSlice that advertises a node's CoreDNS as an endpoint of kube-dns: one endpoint, the
// bridge gateway address, on the node, ready once CoreDNS answers. The Node owns it, so the garbage collector
// removes it with the Node and no stale endpoint outlives a deleted node.
func Slice(node *corev1.Node, addr string, ready bool) *discoveryv1.EndpointSlice {
	udp, tcp, port := corev1.ProtocolUDP, corev1.ProtocolTCP, int32(53)
	dnsName, dnsTCPName := "dns", "dns-tcp"
	serving, terminating := ready, false
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: SliceName(node.Name), Namespace: ServiceNamespace,
			Labels:          map[string]string{discoveryv1.LabelServiceName: ServiceName, discoveryv1.LabelManagedBy: ManagedBy},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{
			Addresses:  []string{addr},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: &serving, Terminating: &terminating},
			NodeName:   &node.Name,
		}},
		Ports: []discoveryv1.EndpointPort{{Name: &dnsName, Protocol: &udp, Port: &port}, {Name: &dnsTCPName, Protocol: &tcp, Port: &port}},
	}
}

// ApplySlice creates the slice or brings the existing one to it (labels, owner, endpoints, ports).
func ApplySlice(ctx context.Context, client kubernetes.Interface, want *discoveryv1.EndpointSlice) error {
	slices := client.DiscoveryV1().EndpointSlices(want.Namespace)
	cur, err := slices.Get(ctx, want.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = slices.Create(ctx, want, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	if apiequality.Semantic.DeepEqual(cur.Labels, want.Labels) && apiequality.Semantic.DeepEqual(cur.OwnerReferences, want.OwnerReferences) &&
		cur.AddressType == want.AddressType && apiequality.Semantic.DeepEqual(cur.Endpoints, want.Endpoints) &&
		apiequality.Semantic.DeepEqual(cur.Ports, want.Ports) {
		return nil // as wanted: no write, no watch event for every proxy
	}
	updated := cur.DeepCopy()
	updated.Labels, updated.OwnerReferences = want.Labels, want.OwnerReferences
	updated.AddressType, updated.Endpoints, updated.Ports = want.AddressType, want.Endpoints, want.Ports
	if _, err := slices.Update(ctx, updated, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("updating EndpointSlice %s/%s: %w", want.Namespace, want.Name, err)
	}
	return nil
}
