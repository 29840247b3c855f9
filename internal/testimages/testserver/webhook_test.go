package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
)

// review posts an AdmissionReview of object (raw JSON, "" for none) with uid "u-1" to path and decodes the
// answer, which must be a 200 that echoes the uid, apiVersion and kind.
func review(t *testing.T, path, object string) admissionv1.AdmissionResponse {
	t.Helper()
	objectField := ""
	if object != "" {
		objectField = `,"object":` + object
	}
	body := `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1","operation":"CREATE"` + objectField + `}}`
	code, out := post(path, body)
	if code != http.StatusOK {
		t.Fatalf("%s: %d %s", path, code, out)
	}
	var got admissionv1.AdmissionReview
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("%s: %v: %s", path, err, out)
	}
	if got.APIVersion != "admission.k8s.io/v1" || got.Kind != "AdmissionReview" || got.Request != nil || got.Response == nil {
		t.Fatalf("%s: answered %s", path, out)
	}
	if got.Response.UID != "u-1" {
		t.Errorf("%s: uid %q, want the request's", path, got.Response.UID)
	}
	return *got.Response
}

// post sends body to path through the server's handler.
func post(path, body string) (int, string) {
	w := httptest.NewRecorder()
	(&server{}).handler().ServeHTTP(w, httptest.NewRequest(http.MethodPost, path, strings.NewReader(body)))
	return w.Code, w.Body.String()
}

func TestValidate(t *testing.T) {
	denied := review(t, "/validate", `{"kind":"ConfigMap","metadata":{"name":"c","labels":{"webhook-test":"deny","a":"b"}}}`)
	if denied.Allowed || denied.Result == nil || denied.Result.Code != 403 ||
		denied.Result.Message != "the test webhook refuses objects labelled webhook-test=deny" {
		t.Errorf("an object labelled webhook-test=deny: %+v", denied)
	}
	for _, object := range []string{
		`{"kind":"ConfigMap","metadata":{"name":"c","labels":{"webhook-test":"allow"}}}`,
		`{"kind":"ConfigMap","metadata":{"name":"c"}}`,
		``, // a DELETE
	} {
		if got := review(t, "/validate", object); !got.Allowed || got.Result != nil || got.Patch != nil {
			t.Errorf("object %s: %+v", object, got)
		}
	}
}

func TestMutate(t *testing.T) {
	for _, c := range []struct{ object, patch string }{
		{`{"metadata":{"name":"c","labels":{"a":"b"}}}`, `[{"op":"add","path":"/metadata/labels/webhook-test-mutated","value":"true"}]`},
		{`{"metadata":{"name":"c","labels":{}}}`, `[{"op":"add","path":"/metadata/labels/webhook-test-mutated","value":"true"}]`},
		{`{"metadata":{"name":"c"}}`, `[{"op":"add","path":"/metadata/labels","value":{"webhook-test-mutated":"true"}}]`},
		{`{"metadata":{"name":"c","labels":null}}`, `[{"op":"add","path":"/metadata/labels","value":{"webhook-test-mutated":"true"}}]`},
		{`{"kind":"ConfigMap"}`, `[{"op":"add","path":"/metadata","value":{"labels":{"webhook-test-mutated":"true"}}}]`},
		// The label deny means nothing to /mutate.
		{`{"metadata":{"labels":{"webhook-test":"deny"}}}`, `[{"op":"add","path":"/metadata/labels/webhook-test-mutated","value":"true"}]`},
	} {
		got := review(t, "/mutate", c.object)
		if !got.Allowed || got.Result != nil || got.PatchType == nil || *got.PatchType != admissionv1.PatchTypeJSONPatch ||
			string(got.Patch) != c.patch {
			t.Errorf("object %s: allowed %v, result %+v, patch type %v, patch %s; want patch %s",
				c.object, got.Allowed, got.Result, got.PatchType, got.Patch, c.patch)
		}
	}
	if got := review(t, "/mutate", ""); !got.Allowed || got.Patch != nil || got.PatchType != nil {
		t.Errorf("no object (a DELETE): %+v", got)
	}
}

// TestWebhookPatchIsBase64 checks the wire form the API server decodes: the patch is a base64 string.
func TestWebhookPatchIsBase64(t *testing.T) {
	_, out := post("/mutate", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1","object":{"metadata":{}}}}`)
	var wire struct {
		Response struct {
			UID       string `json:"uid"`
			Patch     string `json:"patch"`
			PatchType string `json:"patchType"`
		} `json:"response"`
	}
	if err := json.Unmarshal([]byte(out), &wire); err != nil {
		t.Fatal(err)
	}
	// base64 of [{"op":"add","path":"/metadata/labels","value":{"webhook-test-mutated":"true"}}]
	const want = "W3sib3AiOiJhZGQiLCJwYXRoIjoiL21ldGFkYXRhL2xhYmVscyIsInZhbHVlIjp7IndlYmhvb2stdGVzdC1tdXRhdGVkIjoidHJ1ZSJ9fV0="
	if wire.Response.UID != "u-1" || wire.Response.PatchType != "JSONPatch" || wire.Response.Patch != want {
		t.Errorf("response %s", out)
	}
}

func TestWebhookBadRequests(t *testing.T) {
	for _, c := range []struct{ path, body string }{
		{"/validate", `not json`},
		{"/mutate", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":`},
		{"/validate", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`},                                  // no request
		{"/validate", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"operation":"CREATE"}}`}, // no uid
		{"/validate", `{"apiVersion":"v1","kind":"ConfigMap","request":{"uid":"u-1"}}`},
		{"/mutate", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1","object":{"metadata":[]}}}`},
		{"/validate", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1","object":{"metadata":{"labels":{"a":1}}}}}`},
	} {
		if code, out := post(c.path, c.body); code != http.StatusBadRequest || out == "" {
			t.Errorf("%s %s: %d %q, want 400 with a message", c.path, c.body, code, out)
		}
	}
	w := httptest.NewRecorder()
	(&server{}).handler().ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/validate", nil))
	if w.Code != http.StatusMethodNotAllowed {
		t.Errorf("GET /validate: %d", w.Code)
	}
}
