package apiserver

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"

	"github.com/skiff-dev/skiff/apiserver/raftstore"
)

// The package's tests (in package apiserver and apiserver_test) run API servers without Raft or controllers:
// on an in-memory store (NewMemBackend) that applies each command as a one-peer Raft would.

// TestAPIOptions are what a test API server differs in; the zero value is a plain server on a new store.
type TestAPIOptions struct {
	Backend        raftstore.Backend // nil: a new in-memory store
	AgentTransport http.RoundTripper
	Metrics        MetricsSource
}

// StartTestAPI runs an API server of the test's own, stopped at its cleanup, and returns an admin rest config
// for it. Tests that need nothing of their own take SharedTestAPI's.
func StartTestAPI(t testing.TB, o TestAPIOptions) *rest.Config {
	t.Helper()
	return runTestAPI(t, o, t.Cleanup)
}

// sharedAPI is the package's shared test API server.
var sharedAPI struct {
	sync.Mutex
	config *rest.Config
	stop   []func()
}

// SharedTestAPI returns the admin rest config of the API server the package's tests share, started on first
// use and stopped by StopSharedTestAPI (from TestMain). A test on it creates what it needs in namespaces of its
// own (NamespaceOn) and leaves cluster-wide behaviour alone (admission policies, flow control, service CIDRs
// start servers of their own).
func SharedTestAPI(t testing.TB) *rest.Config {
	t.Helper()
	sharedAPI.Lock()
	defer sharedAPI.Unlock()
	if sharedAPI.config == nil {
		sharedAPI.config = runTestAPI(t, TestAPIOptions{}, func(f func()) { sharedAPI.stop = append(sharedAPI.stop, f) })
	}
	return rest.CopyConfig(sharedAPI.config)
}

// StopSharedTestAPI stops the shared test API server, if a test started it.
func StopSharedTestAPI() {
	sharedAPI.Lock()
	defer sharedAPI.Unlock()
	for i := len(sharedAPI.stop) - 1; i >= 0; i-- {
		sharedAPI.stop[i]()
	}
	sharedAPI.stop, sharedAPI.config = nil, nil
}

// NamespaceOn creates a namespace of the test's own, named after prefix and unique, with the default service
// account that pods are admitted against (no controller makes it here), and deletes it at the test's cleanup
// (without a namespace controller it stays Terminating).
func NamespaceOn(t testing.TB, cfg *rest.Config, prefix string) string {
	t.Helper()
	client := kubernetes.NewForConfigOrDie(cfg)
	name := fmt.Sprintf("%s-%06x", prefix, rand.IntN(1<<24))
	ctx := context.Background()
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{}) })
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
	if _, err := client.CoreV1().ServiceAccounts(name).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return name
}

// runTestAPI starts an API server as o says, registers its stop with cleanup, and waits until it takes writes.
func runTestAPI(t testing.TB, o TestAPIOptions, cleanup func(func())) *rest.Config {
	t.Helper()
	if o.Backend == nil {
		o.Backend = NewMemBackend()
	}
	certPEM, keyPEM, err := certutil.GenerateSelfSignedCertKey("127.0.0.1", []net.IP{net.ParseIP("127.0.0.1")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const token = "test-api-admin-token"
	srv, err := New(Config{
		Backend: o.Backend, Listener: ln, CertPEM: certPEM, KeyPEM: keyPEM,
		AdminToken: token, JoinToken: func() string { return "" },
		ServiceAccountKey: func() (*ecdsa.PrivateKey, error) { return nil, errors.New("no key in this test") },
		AgentTransport:    o.AgentTransport,
		Metrics:           o.Metrics,
	})
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Run(ctx)
	}()
	cleanup(func() {
		cancel()
		<-done
	})
	cfg := &rest.Config{Host: "https://" + ln.Addr().String(), BearerToken: token, TLSClientConfig: rest.TLSClientConfig{CAData: certPEM}, QPS: -1}
	client := kubernetes.NewForConfigOrDie(cfg)
	deadline := time.Now().Add(60 * time.Second)
	for {
		// A write rather than a read: an empty store is at revision 0, at which lists are refused.
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "default"}}
		_, err := client.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{})
		if err == nil || apierrors.IsAlreadyExists(err) {
			return cfg
		}
		if time.Now().After(deadline) {
			t.Fatalf("API not ready: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
