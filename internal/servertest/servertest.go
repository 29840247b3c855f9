// Package servertest starts in-process Skiff servers (Raft, gossip and the Kubernetes API, on loopback
// ports) for integration tests, and hands back clients for their API. Everything Start starts is shut down
// and its directories removed when the test ends.
//
// A server's start costs seconds of CPU under the race detector (its API groups, RBAC bootstrap, the
// OpenAPI specs the aggregator gathers), and make test's unit phase is bound by CPU: the tests of a package
// that need only an API with the controllers behind it share one server (Shared), each in namespaces of its
// own (Namespace), and run side by side. A test that changes the server's configuration, stops or
// partitions servers, or creates cluster-wide objects that other tests' controllers act on starts its own:
// a node, say, on which the scheduler then binds the other tests' pods, whose deletion waits for a kubelet
// that is not there.
package servertest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	cryptorand "crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
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
	return start(t, n, mutate, lifetime{tempDir: t.TempDir, cleanup: t.Cleanup, log: testLog{t}})
}

// lifetime is where servers' directories, shutdowns and logs go: the test's (Start), or the package's
// (Shared).
type lifetime struct {
	tempDir func() string
	cleanup func(func())
	log     io.Writer
}

// start starts the servers; t fails the start, life holds what outlives it.
func start(t testing.TB, n int, mutate func(*config.ServerFile), life lifetime) []*Peer {
	t.Helper()
	ip := "127.0.0.1"
	var files []*config.ServerFile
	var joins []string
	// The servers authenticate each other with a cluster token, which a mutate may replace.
	token := fmt.Sprintf("servertest-%d-0123456789", time.Now().UnixNano())
	for i := 0; i < n; i++ {
		gossip := freePort(t, ip)
		f := &config.ServerFile{
			Name: ptr(fmt.Sprintf("cp-%d", i)), DataDir: ptr(life.tempDir()), BindAddr: &ip, LogLevel: ptr("warn"),
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
		logger := hclog.New(&hclog.LoggerOptions{Name: cfg.Name, Level: hclog.Warn, Output: life.log})
		srv, err := server.New(cfg, logger, server.Options{LocalGossip: true})
		if err != nil {
			t.Fatalf("starting %s: %v", cfg.Name, err)
		}
		life.cleanup(srv.Shutdown)
		peers = append(peers, &Peer{Server: srv})
	}
	for _, p := range peers {
		p.Config, p.Client = waitForAPI(t, p.Server.KubeconfigPath())
	}
	return peers
}

// shared is the package's shared server (Shared) and what Main undoes after the package's tests.
var shared struct {
	sync.Mutex
	peer     *Peer
	cleanups []func()
}

// The shared server's load balancer pools: the default one has two addresses, so that a test can fill it.
const (
	LoadBalancerPool     = "192.0.2.0/30"              // 192.0.2.1 and 192.0.2.2
	LoadBalancerEdgePool = "198.51.100.8-198.51.100.9" // the pool named "edge"
)

func sharedLoadBalancerPools(f *config.ServerFile) {
	f.Server.LoadBalancer = &config.LoadBalancerBlock{Pool: []string{LoadBalancerPool},
		Pools: map[string][]string{"edge": {LoadBalancerEdgePool}}}
}

// Shared returns the server that the tests of this package share, started by the first call; the package's
// TestMain must run its tests through Main, which stops it. A test on it creates what it needs in namespaces
// of its own (Namespace) and may run in parallel with the others. The server logs its warnings to stderr,
// which go test shows when the package fails. It has load balancer pools (LoadBalancerPool, LoadBalancerEdgePool).
func Shared(t testing.TB) *Peer {
	t.Helper()
	shared.Lock()
	defer shared.Unlock()
	if shared.peer == nil {
		// A start that fails ends the calling test (and leaves peer nil: the next caller tries again).
		life := lifetime{
			tempDir: func() string {
				dir, err := os.MkdirTemp("", "servertest-shared-")
				if err != nil {
					t.Fatal(err)
				}
				shared.cleanups = append(shared.cleanups, func() { os.RemoveAll(dir) })
				return dir
			},
			cleanup: func(f func()) { shared.cleanups = append(shared.cleanups, f) },
			log:     os.Stderr,
		}
		shared.peer = start(t, 1, sharedLoadBalancerPools, life)[0]
	}
	return shared.peer
}

// Main runs the package's tests, then stops the shared server (if a test started it) and removes its
// directories, then runs the package's own after functions (its other shared fixtures), and exits with the
// tests' code. Call it from TestMain.
func Main(m *testing.M, after ...func()) {
	code := m.Run()
	shared.Lock()
	for i := len(shared.cleanups) - 1; i >= 0; i-- {
		shared.cleanups[i]()
	}
	shared.Unlock()
	for _, f := range after {
		f()
	}
	os.Exit(code)
}

// Namespace creates a namespace of the test's own on p, named after prefix and unique, waits for its default
// service account (pods are refused until the controller makes it), and deletes it at the test's cleanup.
func Namespace(t testing.TB, p *Peer, prefix string) string {
	t.Helper()
	ctx := context.Background()
	name := fmt.Sprintf("%s-%06x", prefix, rand.IntN(1<<24))
	if _, err := p.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Client.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}) })
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, err := p.Client.CoreV1().ServiceAccounts(name).Get(ctx, "default", metav1.GetOptions{})
		if err == nil {
			return name
		}
		if time.Now().After(deadline) {
			t.Fatalf("namespace %s has no default service account after a minute: %v", name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func waitForAPI(t testing.TB, kubeconfig string) (*rest.Config, kubernetes.Interface) {
	t.Helper()
	// A ceiling, not an expectation: a start takes seconds, but make test's unit phase once starved three
	// servers of CPU until they churned through elections for a minute (TestResourceQuotaAcrossServers, after
	// which the RBAC bootstrap still had its roles to reconcile).
	deadline := time.Now().Add(120 * time.Second)
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
	key, err := ecdsa.GenerateKey(elliptic.P256(), cryptorand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(cryptorand.Reader, &x509.CertificateRequest{
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
