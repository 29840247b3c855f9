package apiserver

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"

	"github.com/skiff-dev/skiff/fsm"
)

// TestPendingCustomResources: a request this server cannot route answers 503 with Retry-After only when the
// store holds an Established CustomResourceDefinition serving the requested resource and version; anything
// else keeps the 404.
func TestPendingCustomResources(t *testing.T) {
	backend := NewMemBackend()
	put := func(crd *apiextensionsv1.CustomResourceDefinition) {
		value, err := json.Marshal(crd)
		if err != nil {
			t.Fatal(err)
		}
		backend.Apply(context.Background(), &fsm.Command{Type: fsm.CmdTxn, Txn: &fsm.Txn{Success: []fsm.Op{
			{Type: fsm.OpPut, Key: crdKeyPrefix + crd.Name, Value: value}}}})
	}
	established := []apiextensionsv1.CustomResourceDefinitionCondition{{Type: apiextensionsv1.Established, Status: apiextensionsv1.ConditionTrue}}
	put(&apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: "widgets.example.com"},
		Spec:   apiextensionsv1.CustomResourceDefinitionSpec{Group: "example.com", Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true}, {Name: "v2"}}},
		Status: apiextensionsv1.CustomResourceDefinitionStatus{Conditions: established}})
	put(&apiextensionsv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: "gadgets.example.com"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{Group: "example.com", Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true}}}})

	notFound := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNotFound) })
	h := withPendingCustomResources(backend, Codecs, notFound)
	cases := []struct {
		name string
		info genericapirequest.RequestInfo
		want int
	}{
		{"an Established CRD's served version", genericapirequest.RequestInfo{IsResourceRequest: true, APIGroup: "example.com", APIVersion: "v1", Resource: "widgets", Namespace: "default"}, http.StatusServiceUnavailable},
		{"a version it does not serve", genericapirequest.RequestInfo{IsResourceRequest: true, APIGroup: "example.com", APIVersion: "v2", Resource: "widgets"}, http.StatusNotFound},
		{"a CRD not Established", genericapirequest.RequestInfo{IsResourceRequest: true, APIGroup: "example.com", APIVersion: "v1", Resource: "gadgets"}, http.StatusNotFound},
		{"no CRD", genericapirequest.RequestInfo{IsResourceRequest: true, APIGroup: "example.com", APIVersion: "v1", Resource: "sprockets"}, http.StatusNotFound},
		{"discovery", genericapirequest.RequestInfo{APIGroup: "example.com", APIVersion: "v1"}, http.StatusNotFound},
	}
	for _, c := range cases {
		r := httptest.NewRequest(http.MethodGet, "/apis/example.com/"+c.info.APIVersion+"/"+c.info.Resource, nil)
		r = r.WithContext(genericapirequest.WithRequestInfo(r.Context(), &c.info))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != c.want {
			t.Errorf("%s: %d; want %d", c.name, w.Code, c.want)
			continue
		}
		if c.want == http.StatusServiceUnavailable {
			if w.Header().Get("Retry-After") != "1" || !strings.Contains(w.Body.String(), "not served by this server yet") {
				t.Errorf("%s: Retry-After %q, body %s", c.name, w.Header().Get("Retry-After"), w.Body)
			}
		}
	}
}
