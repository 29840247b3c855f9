package apiserver_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/skiff-dev/skiff/apiserver"
)

// TestNetworkingAndRuntimeClassKinds: networking.k8s.io/v1 Ingresses (with status), IngressClasses and
// NetworkPolicies, and node.k8s.io/v1 RuntimeClasses, are served as by kube-apiserver: created, listed as
// kubectl's tables with kube's columns, refused with a field path when invalid, an Ingress's status changed
// only through its subresource.
func TestNetworkingAndRuntimeClassKinds(t *testing.T) {
	t.Parallel()
	cfg := apiserver.SharedTestAPI(t)
	ns := apiserver.NamespaceOn(t, cfg, "networking")
	c := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()
	net := c.NetworkingV1()
	if _, err := net.IngressClasses().Create(ctx, &networkingv1.IngressClass{ObjectMeta: metav1.ObjectMeta{Name: "nginx"},
		Spec: networkingv1.IngressClassSpec{Controller: "example.com/ingress"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	class := "nginx"
	pathType := networkingv1.PathTypePrefix
	ing := &networkingv1.Ingress{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: networkingv1.IngressSpec{IngressClassName: &class,
		Rules: []networkingv1.IngressRule{{Host: "web.example.com", IngressRuleValue: networkingv1.IngressRuleValue{HTTP: &networkingv1.HTTPIngressRuleValue{
			Paths: []networkingv1.HTTPIngressPath{{Path: "/", PathType: &pathType, Backend: networkingv1.IngressBackend{
				Service: &networkingv1.IngressServiceBackend{Name: "web", Port: networkingv1.ServiceBackendPort{Number: 80}}}}}}}}}},
		Status: networkingv1.IngressStatus{LoadBalancer: networkingv1.IngressLoadBalancerStatus{Ingress: []networkingv1.IngressLoadBalancerIngress{{IP: "10.0.0.9"}}}}}
	created, err := net.Ingresses(ns).Create(ctx, ing, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(created.Status.LoadBalancer.Ingress) != 0 {
		t.Error("an Ingress's create set its status")
	}
	created.Status.LoadBalancer.Ingress = []networkingv1.IngressLoadBalancerIngress{{IP: "10.0.0.9"}}
	if _, err := net.Ingresses(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	bad := ing.DeepCopy()
	bad.Name = "bad"
	bad.Spec.Rules[0].HTTP.Paths[0].Path = "no-slash"
	if _, err := net.Ingresses(ns).Create(ctx, bad, metav1.CreateOptions{}); !apierrors.IsInvalid(err) ||
		!strings.Contains(err.Error(), "spec.rules[0].http.paths[0].path") {
		t.Errorf("an Ingress path without a leading slash: %v; want 422 naming spec.rules[0].http.paths[0].path", err)
	}
	port := networkingv1.NetworkPolicyPort{}
	if _, err := net.NetworkPolicies(ns).Create(ctx, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "deny"},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{port}}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := net.NetworkPolicies(ns).Create(ctx, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "bad"},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{"Sideways"}}}, metav1.CreateOptions{}); !apierrors.IsInvalid(err) ||
		!strings.Contains(err.Error(), "spec.policyTypes") {
		t.Errorf("a NetworkPolicy with an unknown policy type: %v; want 422 naming spec.policyTypes", err)
	}
	// What the node agents could not program is refused with its field: a malformed CIDR, an except outside
	// its block, a port range that ends below its start.
	port80, end70 := intstr.FromInt32(80), int32(70)
	for _, bad := range []struct {
		spec  networkingv1.NetworkPolicySpec
		field string
	}{
		{networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
			{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/33"}}}}}}, "spec.ingress[0].from[0].ipBlock.cidr"},
		{networkingv1.NetworkPolicySpec{Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{
			{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/16", Except: []string{"10.1.0.0/24"}}}}}}}, "spec.egress[0].to[0].ipBlock.except[0]"},
		{networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{Ports: []networkingv1.NetworkPolicyPort{
			{Port: &port80, EndPort: &end70}}}}}, "spec.ingress[0].ports[0].endPort"},
	} {
		_, err := net.NetworkPolicies(ns).Create(ctx, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "bad"}, Spec: bad.spec}, metav1.CreateOptions{})
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), bad.field) {
			t.Errorf("an invalid NetworkPolicy: %v; want 422 naming %s", err, bad.field)
		}
	}
	if _, err := c.NodeV1().RuntimeClasses().Create(ctx, &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "fast"}, Handler: "runc"}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.NodeV1().RuntimeClasses().Create(ctx, &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "bad"}, Handler: "Not_A_Label"}, metav1.CreateOptions{}); !apierrors.IsInvalid(err) ||
		!strings.Contains(err.Error(), "handler") {
		t.Errorf("a RuntimeClass with an invalid handler: %v; want 422 naming handler", err)
	}

	for _, tc := range []struct {
		client                            rest.Interface
		resource, namespace, columns, row string
	}{
		{net.RESTClient(), "ingressclasses", "", "Name,Controller,Parameters,Age", "nginx example.com/ingress <none>"},
		{net.RESTClient(), "ingresses", ns, "Name,Class,Hosts,Address,Ports,Age", "web nginx web.example.com 10.0.0.9 80"},
		{net.RESTClient(), "networkpolicies", ns, "Name,Pod-Selector,Age", "deny <none>"},
		{c.NodeV1().RESTClient(), "runtimeclasses", "", "Name,Handler,Age", "fast runc"},
	} {
		table := &metav1.Table{}
		if err := tc.client.Get().Namespace(tc.namespace).Resource(tc.resource).
			SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").Do(ctx).Into(table); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, col := range table.ColumnDefinitions {
			names = append(names, col.Name)
		}
		if got := strings.Join(names, ","); got != tc.columns || len(table.Rows) != 1 {
			t.Errorf("%s: columns %s and %d rows; want %s and 1", tc.resource, got, len(table.Rows), tc.columns)
			continue
		}
		if got := fmt.Sprintln(table.Rows[0].Cells...); !strings.HasPrefix(got, tc.row) {
			t.Errorf("%s: row %q; want it to start %q", tc.resource, got, tc.row)
		}
	}

	// The RuntimeClass admission: an unknown class is refused; a class's overhead and scheduling are the pod's.
	if _, err := c.NodeV1().RuntimeClasses().Create(ctx, &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "sandboxed"}, Handler: "runc",
		Overhead: &nodev1.Overhead{PodFixed: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m")}},
		Scheduling: &nodev1.Scheduling{NodeSelector: map[string]string{"sandbox": "yes"},
			Tolerations: []corev1.Toleration{{Key: "sandbox", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := func(name, class string, nodeSelector map[string]string) *corev1.Pod {
		no := false
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{RuntimeClassName: &class, NodeSelector: nodeSelector,
			AutomountServiceAccountToken: &no, Containers: []corev1.Container{{Name: "c", Image: "busybox"}}}}
	}
	if _, err := c.CoreV1().Pods(ns).Create(ctx, pod("unknown", "nope", nil), metav1.CreateOptions{}); !apierrors.IsForbidden(err) ||
		!strings.Contains(err.Error(), `RuntimeClass "nope" not found`) {
		t.Errorf("a pod naming an unknown RuntimeClass: %v; want 403 RuntimeClass \"nope\" not found", err)
	}
	if _, err := c.CoreV1().Pods(ns).Create(ctx, pod("conflict", "sandboxed", map[string]string{"sandbox": "no"}), metav1.CreateOptions{}); !apierrors.IsForbidden(err) ||
		!strings.Contains(err.Error(), "conflict: runtimeClass.scheduling.nodeSelector[sandbox]") {
		t.Errorf("a pod whose node selector conflicts with its RuntimeClass's: %v; want 403", err)
	}
	p, err := c.CoreV1().Pods(ns).Create(ctx, pod("sandboxed", "sandboxed", map[string]string{"disk": "ssd"}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.Overhead.Cpu().String() != "250m" || p.Spec.NodeSelector["sandbox"] != "yes" || p.Spec.NodeSelector["disk"] != "ssd" ||
		!slices.ContainsFunc(p.Spec.Tolerations, func(t corev1.Toleration) bool { return t.Key == "sandbox" }) {
		t.Errorf("a pod of RuntimeClass sandboxed: overhead %v, node selector %v, tolerations %v", p.Spec.Overhead, p.Spec.NodeSelector, p.Spec.Tolerations)
	}
	withOverhead := pod("overhead", "fast", nil)
	withOverhead.Spec.Overhead = corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}
	if _, err := c.CoreV1().Pods(ns).Create(ctx, withOverhead, metav1.CreateOptions{}); !apierrors.IsForbidden(err) ||
		!strings.Contains(err.Error(), "Pod Overhead set without corresponding RuntimeClass defined Overhead") {
		t.Errorf("a pod bringing an overhead its class does not define: %v; want 403", err)
	}

	// Discovery lists the group and its resource, as kubectl api-resources reads it.
	resources, err := c.Discovery().ServerResourcesForGroupVersion(schema.GroupVersion{Group: "node.k8s.io", Version: "v1"}.String())
	if err != nil || len(resources.APIResources) != 1 || resources.APIResources[0].Name != "runtimeclasses" {
		t.Fatalf("node.k8s.io/v1 discovery: %v %v", resources, err)
	}
}
