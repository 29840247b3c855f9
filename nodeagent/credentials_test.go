package nodeagent

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/internal/join"
	"github.com/skiff-dev/skiff/internal/servertest"
)

// TestNodeAccessBootstrapAndRenewal is a node's TLS bootstrap against a real server: a wrong join token is
// refused; the right one gets the node's client certificate (approved and signed by the leader's
// controllers), with which the agent acts as system:node:<name>; the certificate is renewed before it
// expires (the servers sign for 3 minutes here) and the agent keeps working; and a restarted agent uses the
// certificate on disk, needing no join token at all.
func TestNodeAccessBootstrapAndRenewal(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server and waits for a certificate renewal")
	}
	token := "0123456789-bootstrap-test"
	peer := servertest.StartWith(t, 1, func(f *config.ServerFile) {
		f.Server.Token = &token
		f.Server.NodeCertificateTTL = ptrTo("3m")
	})[0]
	u, err := url.Parse(peer.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	servers := func() []string { return []string{u.Host} }
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	logger := hclog.New(&hclog.LoggerOptions{Name: "agent", Level: hclog.Info, Output: testWriter{t}})
	cfg := &config.Agent{Name: "n1", DataDir: t.TempDir(), Token: "not-the-join-token"}

	if _, err := nodeAccess(ctx, cfg, "n1", servers, logger); !errors.Is(err, join.ErrCAMismatch) {
		t.Fatalf("a wrong join token: %v, want ErrCAMismatch", err)
	}
	// With the CA from a file, it is the API that refuses the token.
	withCA := *cfg
	withCA.CAFile = filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(withCA.CAFile, peer.Config.CAData, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := nodeAccess(ctx, &withCA, "n1", servers, logger); !errors.Is(err, ErrJoinRefused) {
		t.Fatalf("a wrong join token with ca_file: %v, want ErrJoinRefused", err)
	}

	cfg.Token = token
	agentCtx, stopAgent := context.WithCancel(ctx)
	access, err := nodeAccess(agentCtx, cfg, "n1", servers, logger)
	if err != nil {
		t.Fatal(err)
	}
	client := kubernetes.NewForConfigOrDie(access.config)
	if _, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the node creating its Node with its certificate: %v", err)
	}
	first, err := os.Readlink(access.clientCertFile)
	if err != nil {
		t.Fatal(err)
	}

	// Renewal: a new pair on disk, asked for by the node itself, and the node still acts as itself.
	deadline := time.Now().Add(3 * time.Minute)
	for {
		now, err := os.Readlink(access.clientCertFile)
		if err == nil && now != first {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the certificate was not renewed within 3 minutes (still %s)", first)
		}
		time.Sleep(time.Second)
	}
	csrs, err := peer.Client.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	byNode := 0
	for _, c := range csrs.Items {
		if c.Spec.Username == "system:node:n1" {
			byNode++
		}
	}
	if byNode == 0 {
		t.Errorf("no renewal request by system:node:n1 among %d CSRs", len(csrs.Items))
	}
	time.Sleep(12 * time.Second) // past closeOnRenewal's check: connections made with the new certificate
	if _, err := client.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{}); err != nil {
		t.Fatalf("the node after renewal: %v", err)
	}
	stopAgent()

	// A restart finds the certificate on disk: the join token is not needed any more.
	cfg.Token = "not-the-join-token"
	again, err := nodeAccess(ctx, cfg, "n1", servers, logger)
	if err != nil {
		t.Fatalf("restarting with a certificate on disk: %v", err)
	}
	if _, err := kubernetes.NewForConfigOrDie(again.config).CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{}); err != nil {
		t.Fatalf("the restarted node: %v", err)
	}
	if filepath.Dir(again.clientCertFile) != filepath.Join(cfg.DataDir, "pki") {
		t.Errorf("client certificate at %s, want under <data_dir>/pki", again.clientCertFile)
	}
}

func ptrTo[T any](v T) *T { return &v }

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) { w.t.Logf("%s", b); return len(b), nil }

// TestFailoverDialerWithoutServers: with no server address known (an agent that gossip shows no server
// alive, as in a partition), the dialer fails. It once returned no connection and no error, which
// client-go's connrotation wrapped and then panicked on (chaos round seed 20261149).
func TestFailoverDialerWithoutServers(t *testing.T) {
	conn, err := failoverDialer(func() []string { return nil })(context.Background(), "tcp", "kubernetes:443")
	if conn != nil || err == nil {
		t.Fatalf("dial with no servers = %v, %v; want an error", conn, err)
	}
}
