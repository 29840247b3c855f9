package server_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/fsm"
	"github.com/skiff-dev/skiff/internal/servertest"
	"github.com/skiff-dev/skiff/raftnode"
	"github.com/skiff-dev/skiff/server"
)

// staticCreds are raftnode.Credentials that never change.
type staticCreds struct {
	cert *tls.Certificate
	pool *x509.CertPool
}

func (c staticCreds) RaftCredentials() (*tls.Certificate, *x509.CertPool, error) {
	return c.cert, c.pool, nil
}

// TestRaftPortRefusesAllButServers writes to a server's store through the internal write RPC on its Raft
// port with every credential short of a server certificate (none, a node's certificate from the cluster CA,
// a certificate that names the server name but comes from another CA): nothing gets in. The server's own
// certificate, the control, does.
func TestRaftPortRefusesAllButServers(t *testing.T) {
	peers := servertest.Start(t, 1)
	p := peers[0]
	dataDir := filepath.Dir(p.Server.KubeconfigPath())
	caPEM, err := os.ReadFile(filepath.Join(dataDir, "pki", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	clusterCA := x509.NewCertPool()
	clusterCA.AppendCertsFromPEM(caPEM)
	nodePEM := servertest.NodeClientCert(t, p, "node-a")
	nodeCert, err := tls.LoadX509KeyPair(nodePEM, nodePEM)
	if err != nil {
		t.Fatal(err)
	}
	forged := foreignServerCert(t)
	own, err := server.RaftLayer(dataDir)
	if err != nil {
		t.Fatal(err)
	}

	for i, tc := range []struct {
		name    string
		layer   raftnode.Layer
		allowed bool
	}{
		{"plain TCP", raftnode.TCPLayer{}, false},
		{"a node's client certificate from the cluster CA", raftnode.TLSLayer{Creds: staticCreds{&nodeCert, clusterCA}}, false},
		{"a certificate for the server name from another CA", raftnode.TLSLayer{Creds: staticCreds{forged, clusterCA}}, false},
		{"the server's own certificate", own, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := "/skiff/test/raft-door/" + string(rune('a'+i))
			client := raftnode.NewClient(p.Server.Node().Addr(), tc.layer)
			defer client.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			res, err := client.Apply(ctx, &fsm.Command{Type: fsm.CmdCreate, Key: key, Value: []byte("intruder")})
			if err == nil {
				err = res.Err()
			}
			_, _, getErr := p.Server.Node().Store().Get(key)
			stored := getErr == nil
			if tc.allowed && (err != nil || !stored) {
				t.Fatalf("the server's own certificate could not write: %v (stored %v)", err, stored)
			}
			if !tc.allowed && (err == nil || stored) {
				t.Fatalf("the write got in (error %v, stored %v)", err, stored)
			}
		})
	}
}

// foreignServerCert is a certificate for raftnode.ServerName, both usages, from a CA the cluster never saw.
func foreignServerCert(t *testing.T) *tls.Certificate {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "other-ca"}, IsCA: true, BasicConstraintsValid: true,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "system:skiff-server:forged"},
		DNSNames: []string{raftnode.ServerName}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
