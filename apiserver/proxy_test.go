package apiserver

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// hostIP is an address of this machine that is global unicast, as pod IPs are: the pod proxy refuses others.
func hostIP(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
			return n.IP.String()
		}
	}
	t.Fatal("this machine has no global unicast IPv4 address")
	return ""
}

// TestProxySubresources sends requests through pods/proxy, services/proxy and nodes/proxy of a running API
// server to a backend on this machine, standing for a pod and a node agent, and checks what reaches it and
// what comes back, and the errors before any backend.
func TestProxySubresources(t *testing.T) {
	t.Parallel()
	ip := hostIP(t)
	ln, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	backend := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s %s", r.Method, r.URL.RequestURI(), body)
	}))
	backend.Listener.Close()
	backend.Listener = ln
	backend.Start()
	t.Cleanup(backend.Close)
	backendPort := ln.Addr().(*net.TCPAddr).Port

	agent := newFakeAgent(t)
	agent.answer(http.StatusOK, "agent ok")
	cfg := StartTestAPI(t, TestAPIOptions{AgentTransport: agent.srv.Client().Transport})
	ctx := context.Background()
	client := kubernetes.NewForConfigOrDie(cfg)
	if _, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{
		Addresses:       []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "127.0.0.1"}},
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: agent.port(t)}},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"web", "noip"} {
		pod, err := client.CoreV1().Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "busybox",
				Ports: []corev1.ContainerPort{{ContainerPort: int32(backendPort)}}}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if name == "web" {
			pod.Status.PodIP, pod.Status.PodIPs = ip, []corev1.PodIP{{IP: ip}}
			if _, err := client.CoreV1().Pods("default").UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := client.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "svc"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(int32(backendPort))}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	endpoints := []*corev1.Endpoints{
		{ObjectMeta: metav1.ObjectMeta{Name: "svc"}, Subsets: []corev1.EndpointSubset{{
			Addresses: []corev1.EndpointAddress{{IP: ip, TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: "web", Namespace: "default"}}},
			Ports:     []corev1.EndpointPort{{Name: "http", Port: int32(backendPort)}}}}},
		// An endpoint that is no pod's: never proxied to.
		{ObjectMeta: metav1.ObjectMeta{Name: "external"}, Subsets: []corev1.EndpointSubset{{
			Addresses: []corev1.EndpointAddress{{IP: ip}},
			Ports:     []corev1.EndpointPort{{Port: int32(backendPort)}}}}},
	}
	for _, ep := range endpoints {
		if _, err := client.CoreV1().Endpoints("default").Create(ctx, ep, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client.CoreV1().Services("default").Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "external"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	tlsConfig, err := rest.TLSConfigFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig}}
	t.Cleanup(hc.CloseIdleConnections)
	port := strconv.Itoa(backendPort)
	cases := []struct {
		name, method, path, body string
		wantCode                 int
		want                     string
	}{
		{"pod, its first container port", "GET", "/api/v1/namespaces/default/pods/web/proxy/some/path?x=1", "", 200, "GET /some/path?x=1 "},
		{"pod, a port named, a body", "POST", "/api/v1/namespaces/default/pods/web:" + port + "/proxy/post", "hello", 200, "POST /post hello"},
		{"pod, a trailing slash kept", "GET", "/api/v1/namespaces/default/pods/http:web:" + port + "/proxy/dir/", "", 200, "GET /dir/ "},
		{"pod without an IP", "GET", "/api/v1/namespaces/default/pods/noip/proxy/", "", 400, "address not allowed"},
		{"missing pod", "GET", "/api/v1/namespaces/default/pods/missing/proxy/", "", 404, `pods "missing" not found`},
		{"bad pod name", "GET", "/api/v1/namespaces/default/pods/a:b:c:d/proxy/", "", 400, `invalid pod request "a:b:c:d"`},
		{"service by port name", "GET", "/api/v1/namespaces/default/services/svc:http/proxy/s?q=2", "", 200, "GET /s?q=2 "},
		{"service by port number", "PUT", "/api/v1/namespaces/default/services/http:svc:80/proxy/put", "x", 200, "PUT /put x"},
		{"service, an unknown port number", "GET", "/api/v1/namespaces/default/services/svc:81/proxy/", "", 503, `no service port 81 found for service "svc"`},
		{"service, no port of that name", "GET", "/api/v1/namespaces/default/services/svc/proxy/", "", 503, `no endpoints available for service "svc"`},
		{"service whose endpoint is no pod", "GET", "/api/v1/namespaces/default/services/external/proxy/", "", 503, `no endpoints available for service "external"`},
		{"node, its agent", "GET", "/api/v1/nodes/n1/proxy/healthz", "", 200, "agent ok"},
		{"missing node", "GET", "/api/v1/nodes/missing/proxy/healthz", "", 404, `nodes "missing" not found`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req, err := http.NewRequest(c.method, cfg.Host+c.path, strings.NewReader(c.body))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+cfg.BearerToken)
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			var status metav1.Status
			if json.Unmarshal(body, &status) == nil && status.Kind == "Status" {
				body = []byte(status.Message)
			}
			if resp.StatusCode != c.wantCode || !strings.Contains(string(body), c.want) {
				t.Fatalf("%s %s: %d %q, want %d with %q", c.method, c.path, resp.StatusCode, body, c.wantCode, c.want)
			}
		})
	}
	if got := agent.last(t).URL.Path; got != "/healthz" {
		t.Errorf("the agent was asked for %q, want /healthz", got)
	}
}
