package server

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"net/http"
	"sync"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/client-go/rest"
)

// Skiff's own components act under the identities Kubernetes gives its own, so that RBAC bounds them as it
// bounds kube-scheduler and kube-controller-manager: each holds a client certificate from the cluster CA
// (CN the user, O the groups), kept in memory and renewed when 80% of its life has passed.
var (
	schedulerIdentity         = pkix.Name{CommonName: user.KubeScheduler}
	controllerManagerIdentity = pkix.Name{CommonName: user.KubeControllerManager}
)

// controllerIdentity is a controller's service account in kube-system, as kube-controller-manager with
// --use-service-account-credentials runs each controller; the bootstrap policy binds its role to it.
func controllerIdentity(serviceAccount string) pkix.Name {
	return pkix.Name{
		CommonName:   serviceaccount.MakeUsername("kube-system", serviceAccount),
		Organization: serviceaccount.MakeGroupNames("kube-system"),
	}
}

// identityCertLifetime is how long the components' in-memory certificates live; they are renewed at 80%.
const identityCertLifetime = 7 * 24 * time.Hour

// clientCerts is a client certificate for one identity, issued by the cluster CA on first use and again
// when 80% of its life has passed.
type clientCerts struct {
	s        *Server
	subject  pkix.Name
	lifetime time.Duration

	mu   sync.Mutex
	cert *tls.Certificate
}

func (c *clientCerts) get(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cert != nil && time.Now().Before(c.cert.Leaf.NotBefore.Add(c.lifetime*8/10)) {
		return c.cert, nil
	}
	_, ca, caKey, err := c.s.clusterCA()
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := signLeaf(ca, caKey, &key.PublicKey, c.subject, nil, nil, x509.ExtKeyUsageClientAuth, c.lifetime)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	c.cert = &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
	return c.cert, nil
}

// identityRESTConfig is a client configuration for this peer's API acting as subject: the admin
// kubeconfig's address and CA, with the identity's own certificate instead of the admin's credentials.
func (s *Server) identityRESTConfig(ctx context.Context, subject pkix.Name) (*rest.Config, error) {
	base, err := s.adminRESTConfig(ctx)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(base.TLSClientConfig.CAData) {
		return nil, fmt.Errorf("admin kubeconfig has no CA")
	}
	certs := &clientCerts{s: s, subject: subject, lifetime: identityCertLifetime}
	// A transport of its own, since rest.Config cannot renew a client certificate in memory; HTTP/2 as
	// client-go's would be. Without gzip, as the admin configuration asks (rest.Config's DisableCompression
	// does not reach a transport of one's own): compressing what the peer sends to itself, every watch event
	// of the leader's informers among it, only costs CPU on both ends.
	transport := utilnet.SetTransportDefaults(&http.Transport{DisableCompression: true, TLSClientConfig: &tls.Config{
		RootCAs: pool, MinVersion: tls.VersionTLS12, GetClientCertificate: certs.get,
	}})
	go closeWhenDone(ctx, transport, 10*time.Second)
	cfg := rest.AnonymousClientConfig(base)
	cfg.TLSClientConfig = rest.TLSClientConfig{}
	cfg.Transport = transport
	// Components start once this process has reconciled the bootstrap RBAC policy: started before, their
	// informers would be refused and back off for long.
	select {
	case <-s.rbacPolicyReady:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return cfg, nil
}

// closeWhenDone closes a transport's connections once ctx ends, and again after grace, when the requests
// that were ending with ctx have gone idle. A transport of a leader service lives as long as the service: its
// connections would otherwise outlive every leadership term (client-go's shared transport cache does not hold
// it). The chaos suite found them as a goroutine leak after leader failovers.
func closeWhenDone(ctx context.Context, transport *http.Transport, grace time.Duration) {
	<-ctx.Done()
	transport.CloseIdleConnections()
	time.Sleep(grace)
	transport.CloseIdleConnections()
}

// adminUser is who the admin kubeconfig's certificate names, in system:masters.
const adminUser = "skiff-admin"

// issueClientCertPEM issues a client certificate and its new key from the cluster CA, in PEM.
func issueClientCertPEM(ca *x509.Certificate, caKey *ecdsa.PrivateKey, subject pkix.Name, lifetime time.Duration) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	der, err := signLeaf(ca, caKey, &key.PublicKey, subject, nil, nil, x509.ExtKeyUsageClientAuth, lifetime)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), nil
}
