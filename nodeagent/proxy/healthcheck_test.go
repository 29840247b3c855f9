package proxy

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/internal/freeport"
)

// TestHealthCheckNodePorts: the proxy serves a Local LoadBalancer Service's health check port with 503 while
// its node has no ready endpoint of it and 200 with kube-proxy's body once it has one, stops when the Service
// turns Cluster, and reports a port it cannot listen on.
func TestHealthCheckNodePorts(t *testing.T) {
	port := int32(freeport.One(t))
	h := newHealthChecks("node-1", hclog.NewNullLogger())
	defer h.close()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web", UID: "u1"}, Spec: corev1.ServiceSpec{
		Type: corev1.ServiceTypeLoadBalancer, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal, HealthCheckNodePort: port}}
	ready, notReady, node1, node2 := true, false, "node-1", "node-2"
	slice := func(eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "web-x",
			Labels: map[string]string{discoveryv1.LabelServiceName: "web"}}, Endpoints: eps}
	}
	get := func() (int, map[string]any) {
		t.Helper()
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", port))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		var m map[string]any
		if err := json.Unmarshal(body, &m); err != nil {
			t.Fatalf("%v: %s", err, body)
		}
		return resp.StatusCode, m
	}
	elsewhere := slice(discoveryv1.Endpoint{Addresses: []string{"10.0.1.2"}, NodeName: &node2, Conditions: discoveryv1.EndpointConditions{Ready: &ready}},
		discoveryv1.Endpoint{Addresses: []string{"10.0.0.2"}, NodeName: &node1, Conditions: discoveryv1.EndpointConditions{Ready: &notReady}})
	if p := h.sync([]*corev1.Service{svc}, []*discoveryv1.EndpointSlice{elsewhere}); len(p) != 0 {
		t.Fatal(p)
	}
	if code, m := get(); code != http.StatusServiceUnavailable || m["localEndpoints"] != float64(0) {
		t.Errorf("no ready local endpoint: %d %v; want 503 and 0", code, m)
	}
	here := slice(discoveryv1.Endpoint{Addresses: []string{"10.0.0.2"}, NodeName: &node1, Conditions: discoveryv1.EndpointConditions{Ready: &ready}})
	h.sync([]*corev1.Service{svc}, []*discoveryv1.EndpointSlice{here})
	code, m := get()
	if service, _ := m["service"].(map[string]any); code != http.StatusOK || m["localEndpoints"] != float64(1) ||
		service["namespace"] != "ns" || service["name"] != "web" || m["serviceProxyHealthy"] != true {
		t.Errorf("a ready local endpoint: %d %v; want 200, 1, ns/web", code, m)
	}
	cluster := svc.DeepCopy()
	cluster.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
	h.sync([]*corev1.Service{cluster}, nil)
	if _, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", port)); err == nil {
		t.Error("the port still answers after the Service turned Cluster")
	}
	taken, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	if p := h.sync([]*corev1.Service{svc}, nil); len(p) != 1 || p[0].Reason != ReasonHealthCheckFailed {
		t.Errorf("a taken port: %v; want one %s problem", p, ReasonHealthCheckFailed)
	}
}
