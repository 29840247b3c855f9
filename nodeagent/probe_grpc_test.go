package nodeagent

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"math/big"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
)

// grpcServer serves grpc.health.v1 on loopback (or nothing when withHealth is false) until the test ends.
func grpcServer(t *testing.T, withHealth bool, opts ...grpc.ServerOption) (*health.Server, int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	h := health.NewServer()
	if withHealth {
		healthpb.RegisterHealthServer(srv, h)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	_, port := hostPort(t, ln.Addr().String())
	return h, port
}

func selfSignedTLS(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestProbeGRPC: grpc probes ask the pod's grpc.health.v1 service at the pod IP, as the kubelet does:
// SERVING succeeds; NOT_SERVING, an unknown service, a server without the health service, a closed port and
// a plaintext probe of a TLS server fail with the kubelet's messages; mode TLS reaches a TLS server.
func TestProbeGRPC(t *testing.T) {
	h, port := grpcServer(t, true)
	h.SetServingStatus("db", healthpb.HealthCheckResponse_NOT_SERVING)
	_, bare := grpcServer(t, false)
	_, tlsPort := grpcServer(t, true, grpc.Creds(credentials.NewServerTLSFromCert(ptrTo(selfSignedTLS(t)))))
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, closedPort := hostPort(t, closed.Addr().String())
	closed.Close()

	c := &corev1.Container{Name: "app"}
	pod := probePod("127.0.0.1", *c)
	probe := func(port int, service *string, mode *corev1.GRPCProbeMode) *corev1.Probe {
		return &corev1.Probe{TimeoutSeconds: 1, ProbeHandler: corev1.ProbeHandler{GRPC: &corev1.GRPCAction{Port: int32(port), Service: service, Mode: mode}}}
	}
	db, missing := "db", "missing"
	tlsMode := corev1.GRPCProbeModeTLS
	cases := []struct {
		name    string
		probe   *corev1.Probe
		outcome probeOutcome
		output  string // a prefix
	}{
		{"serving", probe(port, nil, nil), probeSucceeded, "service healthy"},
		{"not serving", probe(port, &db, nil), probeFailed, `service unhealthy (responded with "NOT_SERVING")`},
		{"unknown service", probe(port, &missing, nil), probeFailed, "error: health rpc probe failed: "},
		{"no health service", probe(bare, nil, nil), probeFailed, "error: this server does not implement the grpc health protocol (grpc.health.v1.Health)"},
		{"closed port", probe(closedPort, nil, nil), probeFailed, "timeout: failed to connect service"},
		{"plaintext to TLS", probe(tlsPort, nil, nil), probeFailed, "timeout: failed to connect service"},
		{"TLS", probe(tlsPort, nil, &tlsMode), probeSucceeded, "service healthy"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			outcome, out := probeOnce(context.Background(), livenessProbe, tc.probe, pod, c, "cid", nil)
			if outcome != tc.outcome || !strings.HasPrefix(out, tc.output) {
				t.Errorf("probe = %v, %q; want %v, %q...", outcome, out, tc.outcome, tc.output)
			}
			if d := time.Since(start); d > 3*time.Second {
				t.Errorf("probe took %s, past its 1 s timeout", d)
			}
		})
	}
	if outcome, _ := probeOnce(context.Background(), livenessProbe, probe(port, nil, nil), probePod("", *c), c, "cid", nil); outcome != probeSkipped {
		t.Errorf("no pod IP: %v, want skipped", outcome)
	}
}
