package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/skiff-dev/skiff/internal/version"
)

// An agent newer than the servers, or too far behind, refuses to go on; a server that does not say its
// version (older than the policy) is let be.
func TestAgentVersionSkew(t *testing.T) {
	serverVersion := ""
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != version.Path || serverVersion == "" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, `{"version":%q}`, serverVersion)
	}))
	defer srv.Close()
	client := kubernetes.NewForConfigOrDie(&rest.Config{Host: srv.URL})
	a := &Agent{client: client, logger: hclog.NewNullLogger()}
	defer func(v string) { version.Version = v }(version.Version)
	for _, tt := range []struct{ agent, server, want string }{
		{"v1.4.0", "v1.4.0", ""},
		{"v1.3.2", "v1.4.0", ""},
		{"v1.5.0", "v1.4.0", "agent v1.5.0 is newer than the servers (v1.4.0): upgrade the servers first"},
		{"v1.1.0", "v1.4.0", "more than 2 minor versions older"},
		{"v1.5.0", "", ""}, // the server predates the endpoint
	} {
		version.Version, serverVersion = tt.agent, tt.server
		err := a.checkVersionSkew(context.Background())
		if tt.want == "" && err != nil || tt.want != "" && (!errors.Is(err, ErrVersionSkew) || !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("agent %s, server %q: %v, want %q", tt.agent, tt.server, err, tt.want)
		}
	}
}
