package apiserver_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/skiff-dev/skiff/internal/servertest"
)

// TestErrorStatuses sends bad requests of each kind over plain HTTP and checks the code and the Status body:
// kind Status, the same code, the reason, and for 422 the field causes.
func TestErrorStatuses(t *testing.T) {
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
