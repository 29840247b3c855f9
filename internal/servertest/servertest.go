// Package servertest starts in-process Skiff servers (Raft, gossip and the Kubernetes API, on loopback
// ports) for integration tests, and hands back clients for their API. Everything it starts is shut down
// and its directories removed when the test ends.
package servertest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/certificate/csr"
	"k8s.io/client-go/util/retry"

	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/internal/freeport"
	"github.com/skiff-dev/skiff/server"
)

// Peer is one running server.
type Peer struct {
	Server *server.Server
	// Config is a rest config for the peer's API with the admin credential and no client-side rate limit.
	Config *rest.Config
	Client kubernetes.Interface
}

// Start starts n servers that bootstrap one cluster with fast Raft timeouts, and waits until each serves
// the Kubernetes API.
func Start(t testing.TB, n int) []*Peer { return StartWith(t, n, nil) }

// StartWith is Start with a change to every server's configuration file, applied before it is resolved.
func StartWith(t testing.TB, n int, mutate func(*config.ServerFile)) []*Peer {
	t.Helper()
	ip := "127.0.0.1"
	var files []*config.ServerFile
	var joins []string
	// The servers authenticate each other with a cluster token, which a mutate may replace.
	token := fmt.Sprintf("servertest-%d-0123456789", time.Now().UnixNano())
	for i := 0; i < n; i++ {
		gossip := freePort(t, ip)
		f := &config.ServerFile{
			Name: ptr(fmt.Sprintf("cp-%d", i)), DataDir: ptr(t.TempDir()), BindAddr: &ip, LogLevel: ptr("warn"),
			Ports: &config.PortsBlock{API: ptr(freePort(t, ip)), Raft: ptr(freePort(t, ip)), Gossip: &gossip},
			Server: &config.ServerBlock{
				BootstrapExpect: &n, RetryInterval: ptr("100ms"), Token: &token,
				// hashicorp/raft's defaults, twice the production ones: four race-detector test packages at a
				// time on two cores (make test) starve leaders of CPU past a 250 ms lease, and the peers churned
				// through elections (an autopilot promotion never saw 1 s of one leader's rule).
				Raft: &config.RaftBlock{HeartbeatTimeout: ptr("1s"), ElectionTimeout: ptr("1s"), LeaderLeaseTimeout: ptr("500ms")},
			},
		}
		if mutate != nil {
			mutate(f)
		}
		files = append(files, f)
		joins = append(joins, fmt.Sprintf("%s:%d", ip, gossip))
	}
	var peers []*Peer
	for _, f := range files {
		cfg, err := config.LoadServer("", f)
		if err != nil {
			t.Fatal(err)
		}
		cfg.RetryJoin = joins
		logger := hclog.New(&hclog.LoggerOptions{Name: cfg.Name, Level: hclog.Warn, Output: testLog{t}})
		srv, err := server.New(cfg, logger, server.Options{LocalGossip: true})
		if err != nil {
			t.Fatalf("starting %s: %v", cfg.Name, err)
		}
		t.Cleanup(srv.Shutdown)
		peers = append(peers, &Peer{Server: srv})
	}
	for _, p := range peers {
		p.Config, p.Client = waitForAPI(t, p.Server.KubeconfigPath())
	}
	return peers
}

func waitForAPI(t testing.TB, kubeconfig string) (*rest.Config, kubernetes.Interface) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var lastErr error
	for time.Now().Before(deadline) {
		if _, err := os.Stat(kubeconfig); err != nil {
			lastErr = err
			time.Sleep(100 * time.Millisecond)
			continue
		}
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		cfg.QPS, cfg.Burst = -1, 0
		client := kubernetes.NewForConfigOrDie(cfg)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, lastErr = client.CoreV1().Namespaces().Get(ctx, "default", metav1.GetOptions{})
		if lastErr == nil {
			// Ready includes the bootstrap RBAC policy, which tests acting as other users need.
			_, lastErr = client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		}
		cancel()
		if lastErr == nil {
			return cfg, client
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("API at %s not ready: %v", kubeconfig, lastErr)
	return nil, nil
}

func freePort(t testing.TB, ip string) int {
	t.Helper()
	return freeport.One(t, ip)
}

func ptr[T any](v T) *T { return &v }

// testLog sends server logs to the test's log, shown when it fails.
type testLog struct{ t testing.TB }

func (l testLog) Write(b []byte) (int, error) { l.t.Logf("%s", b); return len(b), nil }

// NodeClientCert gets a client certificate for system:node:<node> through the CSR API, as an agent does
// after TLS bootstrap, and returns the file holding it and its key (PEM, one file, as a kubeconfig's
// client-certificate and client-key may both name it). The CSR is approved by the peer's admin, and signed by
// the leader's signer.
func NodeClientCert(t testing.TB, p *Peer, node string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}}}, key)
	if err != nil {
		t.Fatal(err)
	}
	csrs := p.Client.CertificatesV1().CertificateSigningRequests()
	req, err := csrs.Create(ctx, &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "node-" + node + "-"},
		Spec: certificatesv1.CertificateSigningRequestSpec{SignerName: certificatesv1.KubeAPIServerClientKubeletSignerName,
			Request: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
			Usages:  []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The leader's approver may approve it first (the admin may ask for node client certificates): then the
	// approval conflicts, and the request, reread, is approved already.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := csrs.Get(ctx, req.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range cur.Status.Conditions {
			if c.Type == certificatesv1.CertificateApproved {
				return nil
			}
		}
		cur.Status.Conditions = append(cur.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "ServertestApproved"})
		_, err = csrs.UpdateApproval(ctx, cur.Name, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	certPEM, err := csr.WaitForCertificate(ctx, p.Client, req.Name, req.UID)
	if err != nil {
		t.Fatalf("waiting for the signer: %v", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), node+".pem")
	if err := os.WriteFile(path, append(certPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})...), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
