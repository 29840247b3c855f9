package server

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"time"

	"github.com/skiff-dev/skiff/apiserver"
	"github.com/skiff-dev/skiff/fsm"
	"github.com/skiff-dev/skiff/internal/servicecidr"
)

// Cluster secrets live in the replicated store, created once by the first leader. The values are drawn by
// the leader before proposing; Apply only stores bytes.
const (
	adminTokenKey = "/skiff/admin/token"      // bearer token of the admin kubeconfig
	clusterCAKey  = "/skiff/pki/ca"           // PEM certificate then PEM EC private key of the cluster CA
	joinTokenKey  = "/skiff/agent/join-token" // the token node agents join with
	// serviceAccountKeyKey holds the PEM EC private key that service account tokens are signed with.
	serviceAccountKeyKey = "/skiff/pki/service-account-key"
	// frontProxyCAKey holds the front-proxy CA (certificate, then key): it signs the client certificate the
	// aggregator shows extension API servers, which trust it through kube-system's
	// extension-apiserver-authentication ConfigMap, as kube-apiserver's --requestheader-client-ca-file.
	frontProxyCAKey = "/skiff/pki/front-proxy-ca"
)

// ensureClusterSecrets is a leader service: it stores the cluster CA (drawn before Raft, see raftPKI), the
// admin token, the join token (the cluster token's secret, until an operator rotates it) and the service
// account key if missing.
func (s *Server) ensureClusterSecrets(ctx context.Context) {
	joinToken := func() ([]byte, error) { return []byte(s.token.Secret), nil }
	for _, secret := range []struct {
		key  string
		make func() ([]byte, error)
	}{{clusterCAKey, s.pki.bundle}, {frontProxyCAKey, newFrontProxyCA}, {adminTokenKey, newToken}, {joinTokenKey, joinToken},
		{serviceAccountKeyKey, newServiceAccountKey}} {
		if _, _, err := s.node.Store().Get(secret.key); err == nil {
			continue
		}
		value, err := secret.make()
		if err == nil {
			value, err = s.sealSecret(secret.key, value)
		}
		if err != nil {
			s.logger.Error("creating cluster secret", "key", secret.key, "error", err)
			return
		}
		res, err := s.node.Apply(ctx, &fsm.Command{Type: fsm.CmdCreate, Key: secret.key, Value: value})
		if err == nil {
			err = res.Err()
		}
		if err != nil && !errors.Is(err, fsm.ErrAlreadyExists) && ctx.Err() == nil {
			s.logger.Error("storing cluster secret", "key", secret.key, "error", err)
		}
	}
}

func newToken() ([]byte, error) {
	buf := make([]byte, 32)
	if _, err := rand.Read(buf); err != nil {
		return nil, err
	}
	return []byte(hex.EncodeToString(buf)), nil
}

func newServiceAccountKey() ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

// serviceAccountKey returns the key service account tokens are signed with, once it has replicated here.
func (s *Server) serviceAccountKey() (*ecdsa.PrivateKey, error) {
	plain, _, err := s.openSecret(serviceAccountKeyKey)
	if err != nil {
		return nil, err
	}
	s.saKeyMu.Lock()
	defer s.saKeyMu.Unlock()
	if s.saKey == nil || !bytes.Equal(s.saKeyPEM, plain) {
		block, _ := pem.Decode(plain)
		if block == nil {
			return nil, errors.New("service account key in the store is not PEM")
		}
		key, err := x509.ParseECPrivateKey(block.Bytes)
		if err != nil {
			return nil, err
		}
		s.saKey, s.saKeyPEM = key, plain
	}
	return s.saKey, nil
}

func newCA() ([]byte, error) { return newNamedCA("skiff-ca") }

func newFrontProxyCA() ([]byte, error) { return newNamedCA("skiff-front-proxy-ca") }

// newNamedCA draws a CA: its PEM certificate, then its PEM EC private key.
func newNamedCA(name string) ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name},
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(10, 0, 0),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	pem.Encode(&out, &pem.Block{Type: "CERTIFICATE", Bytes: der})
	pem.Encode(&out, &pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	return out.Bytes(), nil
}

// clusterCA returns the CA certificate (PEM) and its parsed form, once it has replicated to this peer.
func (s *Server) clusterCA() (certPEM []byte, cert *x509.Certificate, key *ecdsa.PrivateKey, err error) {
	return s.storedCA(clusterCAKey)
}

// storedCA reads a CA the store holds under key: its certificate (PEM and parsed) and key.
func (s *Server) storedCA(storeKey string) (certPEM []byte, cert *x509.Certificate, key *ecdsa.PrivateKey, err error) {
	plain, _, err := s.openSecret(storeKey)
	if err != nil {
		return nil, nil, nil, err
	}
	certBlock, rest := pem.Decode(plain)
	keyBlock, _ := pem.Decode(rest)
	if certBlock == nil || keyBlock == nil {
		return nil, nil, nil, fmt.Errorf("%s in the store is not PEM", storeKey)
	}
	if cert, err = x509.ParseCertificate(certBlock.Bytes); err != nil {
		return nil, nil, nil, err
	}
	if key, err = x509.ParseECPrivateKey(keyBlock.Bytes); err != nil {
		return nil, nil, nil, err
	}
	return pem.EncodeToMemory(certBlock), cert, key, nil
}

// signingCA is the cluster CA with its key: from the store, or before the store has it, the one this server
// holds for its Raft certificate.
func (s *Server) signingCA() (*x509.Certificate, *ecdsa.PrivateKey, error) {
	if _, ca, key, err := s.clusterCA(); err == nil {
		return ca, key, nil
	}
	_, ca, key, _, err := s.pki.signer()
	return ca, key, err
}

// servingCerts hands out this peer's API serving certificate: signed by the cluster CA once the CA has
// replicated here, self-signed before that (clients that verify against the CA see "not ready").
type servingCerts struct {
	s      *Server
	mu     sync.Mutex
	cert   *tls.Certificate
	fromCA bool
}

func (c *servingCerts) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fromCA {
		return c.cert, nil
	}
	caCert, caKey, err := c.s.signingCA()
	switch {
	case err == nil:
		cert, err := c.issue(caCert, caKey)
		if err != nil {
			return nil, err
		}
		c.cert, c.fromCA = cert, true
	case c.cert == nil:
		cert, err := c.issue(nil, nil)
		if err != nil {
			return nil, err
		}
		c.cert = cert
	}
	return c.cert, nil
}

// issue creates a serving certificate for this peer's names and addresses; with a nil CA it is self-signed.
func (c *servingCerts) issue(ca *x509.Certificate, caKey *ecdsa.PrivateKey) (*tls.Certificate, error) {
	certPEM, keyPEM, err := c.issuePEM(ca, caKey)
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	return &cert, err
}

// issuePEM is issue, in PEM form.
func (c *servingCerts) issuePEM(ca *x509.Certificate, caKey *ecdsa.PrivateKey) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return nil, nil, err
	}
	cfg := c.s.cfg
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: cfg.Name},
		NotBefore: now.Add(-time.Hour), NotAfter: now.AddDate(1, 0, 0),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		// The names and the ClusterIP pods reach the API by, as kube-apiserver's certificate carries them:
		// client-go's in-cluster config dials the ClusterIP.
		DNSNames: []string{"localhost", cfg.Name, "kubernetes", "kubernetes.default", "kubernetes.default.svc",
			"kubernetes.default.svc." + cfg.ClusterDomain},
	}
	for _, a := range []string{cfg.BindAddr, cfg.AdvertiseAddr, "127.0.0.1"} {
		if ip := net.ParseIP(a); ip != nil && !ip.IsUnspecified() {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		}
	}
	if ip, err := servicecidr.KubernetesServiceIP(cfg.ServiceCIDR); err == nil {
		tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
	}
	parent, signer := tmpl, any(key)
	if ca != nil {
		parent, signer = ca, caKey
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		return nil, nil, fmt.Errorf("issuing serving certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if ca != nil { // serve the chain, so clients that trust the CA verify it
		certPEM = append(certPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw})...)
	}
	return certPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}

// peerTransport is the HTTP transport one peer uses to reach another's API: it trusts the cluster CA.
func (s *Server) peerTransport() http.RoundTripper {
	pool := x509.NewCertPool()
	if caPEM, _, _, err := s.clusterCA(); err == nil {
		pool.AppendCertsFromPEM(caPEM)
	}
	return &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, ResponseHeaderTimeout: time.Minute}
}

// writeFrontProxyClientCert issues this server's front-proxy client certificate from the front-proxy CA and
// writes it and its key under the data dir, where the aggregator reads them; it returns the two paths.
func (s *Server) writeFrontProxyClientCert() (certFile, keyFile string, err error) {
	_, ca, caKey, err := s.storedCA(frontProxyCAKey)
	if err != nil {
		return "", "", err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return "", "", err
	}
	now := time.Now()
	notAfter := now.Add(serverCertLifetime)
	if notAfter.After(ca.NotAfter) {
		notAfter = ca.NotAfter
	}
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: apiserver.FrontProxyClientName},
		NotBefore: now.Add(-5 * time.Minute), NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, ca, &key.PublicKey, caKey)
	if err != nil {
		return "", "", err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", err
	}
	certFile, keyFile = filepath.Join(s.cfg.DataDir, "front-proxy-client.crt"), filepath.Join(s.cfg.DataDir, "front-proxy-client.key")
	if err := writeFileAtomic(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})); err != nil {
		return "", "", err
	}
	if err := writeFileAtomic(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}
