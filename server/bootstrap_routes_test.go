package server

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// A server that has not started its API yet (after a restart, until it has caught up) must answer API paths
// with 503 and Retry-After: a 404 would tell clients the object does not exist (the chaos suite saw gets and
// lists through a restarting server come back NotFound).
func TestBootstrapRoutesAnswer503(t *testing.T) {
	h := (&Server{}).bootstrapRoutes()
	for _, path := range []string{"/api/v1/namespaces/default/configmaps/x", "/apis/apps/v1/deployments", "/version"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" {
			t.Errorf("GET %s while starting: %d, Retry-After %q; want 503 with Retry-After", path, rec.Code, rec.Header().Get("Retry-After"))
		}
	}
}
