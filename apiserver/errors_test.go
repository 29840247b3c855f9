package apiserver_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/internal/servertest"
)

// TestErrorStatuses sends bad requests of each kind over plain HTTP and checks the code and the Status body:
// kind Status, the same code, the reason, and for 422 the field causes.
func TestErrorStatuses(t *testing.T) {
	t.Parallel()
	peer := servertest.Start(t, 1)[0]
	client, err := rest.HTTPClientFor(peer.Config)
	if err != nil {
		t.Fatal(err)
	}
	const cm = `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"errs"}}`
	do := func(method, path, contentType, body string) (int, metav1.Status, string) {
		t.Helper()
		req, err := http.NewRequest(method, peer.Config.Host+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		req.Header.Set("Accept", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var status metav1.Status
		json.Unmarshal(raw, &status)
		return resp.StatusCode, status, string(raw)
	}
	if code, _, raw := do("POST", "/api/v1/namespaces/default/configmaps", "application/json", cm); code != http.StatusCreated {
		t.Fatalf("setup create: %d %s", code, raw)
	}
	rs := func(name, spec string) string {
		return `{"apiVersion":"apps/v1","kind":"ReplicaSet","metadata":{"name":"` + name + `"},"spec":` + spec + `}`
	}
	const rsPath = "/apis/apps/v1/namespaces/default/replicasets"
	const goodRS = `{"selector":{"matchLabels":{"a":"b"}},"template":{"metadata":{"labels":{"a":"b"}},"spec":{"containers":[{"name":"c","image":"i"}]}}}`
	if code, _, raw := do("POST", rsPath, "application/json", rs("rs", goodRS)); code != http.StatusCreated {
		t.Fatalf("setup create: %d %s", code, raw)
	}
	svc := func(name, spec string) string {
		return `{"apiVersion":"v1","kind":"Service","metadata":{"name":"` + name + `"},"spec":` + spec + `}`
	}
	const svcPath = "/api/v1/namespaces/default/services"
	cases := []struct {
		name                      string
		method, path, ctype, body string
		code                      int
		reason                    metav1.StatusReason
		cause                     string // a field named in the causes, for 422
	}{
		{"unsupported field selector", "GET", "/api/v1/pods?fieldSelector=spec.colour%3Dblue", "", "", 400, metav1.StatusReasonBadRequest, ""},
		{"malformed JSON", "POST", "/api/v1/namespaces/default/configmaps", "application/json", `{"kind":`, 400, metav1.StatusReasonBadRequest, ""},
		{"missing object", "GET", "/api/v1/namespaces/default/configmaps/nope", "", "", 404, metav1.StatusReasonNotFound, ""},
		{"missing namespace", "POST", "/api/v1/namespaces/nowhere/configmaps", "application/json", cm, 404, metav1.StatusReasonNotFound, ""},
		{"method not allowed on a collection", "PUT", "/api/v1/namespaces/default/configmaps", "application/json", cm, 405, metav1.StatusReasonMethodNotAllowed, ""},
		{"already exists", "POST", "/api/v1/namespaces/default/configmaps", "application/json", cm, 409, metav1.StatusReasonAlreadyExists, ""},
		{"stale update", "PUT", "/api/v1/namespaces/default/configmaps/errs", "application/json",
			`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"errs","resourceVersion":"1"}}`, 409, metav1.StatusReasonConflict, ""},
		{"unsupported media type", "POST", "/api/v1/namespaces/default/configmaps", "text/x-nonsense", cm, 415, metav1.StatusReasonUnsupportedMediaType, ""},
		{"invalid name", "POST", "/api/v1/namespaces/default/configmaps", "application/json",
			`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"Not_Valid"}}`, 422, metav1.StatusReasonInvalid, "metadata.name"},
		{"unknown field, strict", "POST", "/api/v1/namespaces/default/configmaps?fieldValidation=Strict", "application/json",
			`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"strict"},"colour":"blue"}`, 400, metav1.StatusReasonBadRequest, ""},
		{"replicaset selector not matching its template", "POST", rsPath, "application/json",
			rs("rs-sel", `{"selector":{"matchLabels":{"a":"x"}},"template":{"metadata":{"labels":{"a":"b"}},"spec":{"containers":[{"name":"c","image":"i"}]}}}`),
			422, metav1.StatusReasonInvalid, "spec.template.metadata.labels"},
		{"replicaset without a selector", "POST", rsPath, "application/json",
			rs("rs-nosel", `{"template":{"metadata":{"labels":{"a":"b"}},"spec":{"containers":[{"name":"c","image":"i"}]}}}`), 422, metav1.StatusReasonInvalid, "spec.selector"},
		{"replicaset with negative replicas", "POST", rsPath, "application/json",
			rs("rs-neg", `{"replicas":-1,"selector":{"matchLabels":{"a":"b"}},"template":{"metadata":{"labels":{"a":"b"}},"spec":{"containers":[{"name":"c","image":"i"}]}}}`),
			422, metav1.StatusReasonInvalid, "spec.replicas"},
		{"replicaset whose pods do not restart", "POST", rsPath, "application/json",
			rs("rs-never", `{"selector":{"matchLabels":{"a":"b"}},"template":{"metadata":{"labels":{"a":"b"}},"spec":{"restartPolicy":"Never","containers":[{"name":"c","image":"i"}]}}}`),
			422, metav1.StatusReasonInvalid, "spec.template.spec.restartPolicy"},
		{"replicaset template without containers", "POST", rsPath, "application/json",
			rs("rs-empty", `{"selector":{"matchLabels":{"a":"b"}},"template":{"metadata":{"labels":{"a":"b"}}}}`), 422, metav1.StatusReasonInvalid, "spec.template.spec.containers"},
		{"replicaset selector changed", "PATCH", rsPath + "/rs", "application/merge-patch+json",
			`{"spec":{"selector":{"matchLabels":{"a":"c"}},"template":{"metadata":{"labels":{"a":"c"}}}}}`, 422, metav1.StatusReasonInvalid, "spec.selector"},
		{"service with an unknown protocol", "POST", svcPath, "application/json", svc("svc-proto", `{"ports":[{"port":80,"protocol":"ICMP"}]}`),
			422, metav1.StatusReasonInvalid, "spec.ports[0].protocol"},
		{"service with two unnamed ports", "POST", svcPath, "application/json", svc("svc-names", `{"ports":[{"port":80},{"port":81}]}`),
			422, metav1.StatusReasonInvalid, "spec.ports[1].name"},
		{"service with a duplicate port", "POST", svcPath, "application/json", svc("svc-dup", `{"ports":[{"name":"a","port":80},{"name":"b","port":80}]}`),
			422, metav1.StatusReasonInvalid, "spec.ports[1]"},
		{"service port out of range", "POST", svcPath, "application/json", svc("svc-range", `{"ports":[{"port":70000}]}`),
			422, metav1.StatusReasonInvalid, "spec.ports[0].port"},
		{"nodePort on a ClusterIP service", "POST", svcPath, "application/json", svc("svc-np", `{"ports":[{"port":80,"nodePort":30080}]}`),
			422, metav1.StatusReasonInvalid, "spec.ports[0].nodePort"},
		{"nodePort out of range", "POST", svcPath, "application/json", svc("svc-nprange", `{"type":"NodePort","ports":[{"port":80,"nodePort":80}]}`),
			422, metav1.StatusReasonInvalid, "spec.ports[0].nodePort"},
		{"service without ports", "POST", svcPath, "application/json", svc("svc-noports", `{"selector":{"a":"b"}}`),
			422, metav1.StatusReasonInvalid, "spec.ports"},
		{"ExternalName without a name", "POST", svcPath, "application/json", svc("svc-ext", `{"type":"ExternalName"}`),
			422, metav1.StatusReasonInvalid, "spec.externalName"},
		{"unknown session affinity", "POST", svcPath, "application/json", svc("svc-aff", `{"sessionAffinity":"Cookie","ports":[{"port":80}]}`),
			422, metav1.StatusReasonInvalid, "spec.sessionAffinity"},
		{"externalTrafficPolicy on a ClusterIP service", "POST", svcPath, "application/json", svc("svc-etp", `{"externalTrafficPolicy":"Local","ports":[{"port":80}]}`),
			422, metav1.StatusReasonInvalid, "spec.externalTrafficPolicy"},
		{"externalIPs not an address", "POST", svcPath, "application/json", svc("svc-eip", `{"externalIPs":["192.0.2.1","nowhere"],"ports":[{"port":80}]}`),
			422, metav1.StatusReasonInvalid, "spec.externalIPs[1]"},
		{"externalIPs loopback", "POST", svcPath, "application/json", svc("svc-eip-lo", `{"externalIPs":["127.0.0.2"],"ports":[{"port":80}]}`),
			422, metav1.StatusReasonInvalid, "spec.externalIPs[0]"},
		{"loadBalancerSourceRanges not a CIDR", "POST", svcPath, "application/json",
			svc("svc-lbsr", `{"type":"LoadBalancer","loadBalancerSourceRanges":["10.0.0.0/8","10.0.0.1/33"],"ports":[{"port":80}]}`),
			422, metav1.StatusReasonInvalid, "spec.LoadBalancerSourceRanges[1]"},
		{"loadBalancerSourceRanges on a ClusterIP service", "POST", svcPath, "application/json",
			svc("svc-lbsr-cip", `{"loadBalancerSourceRanges":["10.0.0.0/8"],"ports":[{"port":80}]}`),
			422, metav1.StatusReasonInvalid, "spec.LoadBalancerSourceRanges"},
		{"allocateLoadBalancerNodePorts on a NodePort service", "POST", svcPath, "application/json",
			svc("svc-alnp", `{"type":"NodePort","allocateLoadBalancerNodePorts":false,"ports":[{"port":80}]}`),
			422, metav1.StatusReasonInvalid, "spec.allocateLoadBalancerNodePorts"},
		{"loadBalancerClass not a qualified name", "POST", svcPath, "application/json",
			svc("svc-lbc", `{"type":"LoadBalancer","loadBalancerClass":"not a class","ports":[{"port":80}]}`),
			422, metav1.StatusReasonInvalid, "spec.loadBalancerClass"},
		{"loadBalancerClass on a ClusterIP service", "POST", svcPath, "application/json",
			svc("svc-lbc-cip", `{"loadBalancerClass":"example.com/lb","ports":[{"port":80}]}`),
			422, metav1.StatusReasonInvalid, "spec.loadBalancerClass"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, status, raw := do(tc.method, tc.path, tc.ctype, tc.body)
			if code != tc.code || status.Kind != "Status" || int(status.Code) != tc.code || status.Reason != tc.reason {
				t.Fatalf("got HTTP %d with %s; want %d, a Status with reason %s", code, raw, tc.code, tc.reason)
			}
			if tc.cause != "" {
				found := false
				if status.Details != nil {
					for _, c := range status.Details.Causes {
						found = found || c.Field == tc.cause
					}
				}
				if !found {
					t.Fatalf("422 without a cause for %s: %s", tc.cause, raw)
				}
			}
		})
	}
}

// TestGoneAndUnavailable covers the two error codes that need a cluster state: a watch from a revision older
// than the watch cache gets a 410 Expired event, and a write while the cluster has no leader gets 503 with
// Retry-After once the write timeout passes.
func TestGoneAndUnavailable(t *testing.T) {
	t.Parallel()
	peers := servertest.StartWith(t, 3, func(f *config.ServerFile) { f.Server.Raft.WriteTimeout = ptr("1s") })
	client, err := rest.HTTPClientFor(peers[0].Config)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Get(peers[0].Config.Host + "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion=1")
	if err != nil {
		t.Fatal(err)
	}
	var event struct {
		Type   string
		Object metav1.Status
	}
	err = json.NewDecoder(resp.Body).Decode(&event)
	resp.Body.Close()
	if err != nil || event.Type != "ERROR" || event.Object.Code != http.StatusGone || event.Object.Reason != metav1.StatusReasonExpired {
		t.Fatalf("watch from revision 1: %+v (%v), want an ERROR event with a 410 Expired Status", event, err)
	}

	// Leave peer 0 alone: without a quorum there is no leader.
	peers[1].Server.Shutdown()
	peers[2].Server.Shutdown()
	req, _ := http.NewRequest("POST", peers[0].Config.Host+"/api/v1/namespaces/default/configmaps",
		strings.NewReader(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"no-leader"}}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err = client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var status metav1.Status
	json.Unmarshal(raw, &status)
	if resp.StatusCode != http.StatusServiceUnavailable || status.Kind != "Status" || status.Code != http.StatusServiceUnavailable ||
		resp.Header.Get("Retry-After") == "" {
		t.Fatalf("write without a leader: HTTP %d, Retry-After %q, body %s; want 503 with Retry-After and a Status",
			resp.StatusCode, resp.Header.Get("Retry-After"), raw)
	}
}

func ptr[T any](v T) *T { return &v }
