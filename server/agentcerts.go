package server

import (
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/endpoints/request"

	"github.com/skiff-dev/skiff/internal/join"
)

// agentServingCertLifetime is how long an agent's serving certificate is valid; the agent asks for a new one
// when 80% of it has passed, as the kubelet rotates its own.
const agentServingCertLifetime = 365 * 24 * time.Hour

// signAgentServingCert issues the serving certificate of an agent's HTTPS endpoint (join.ServingCertPath).
// The caller must be the node it asks for, and may name only that node and the addresses its Node reports:
// a node cannot get a certificate that would let it pose as another node's endpoint.
func (s *Server) signAgentServingCert(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		writeStatus(w, http.StatusMethodNotAllowed, "MethodNotAllowed", "only POST is allowed")
		return
	}
	u, ok := request.UserFrom(r.Context())
	if !ok {
		writeStatus(w, http.StatusForbidden, "Forbidden", "only a node may ask for an agent serving certificate")
		return
	}
	node, isNode := strings.CutPrefix(u.GetName(), "system:node:")
	if !isNode || !slices.Contains(u.GetGroups(), "system:nodes") {
		writeStatus(w, http.StatusForbidden, "Forbidden", "only a node may ask for an agent serving certificate")
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	if err != nil {
		writeStatus(w, http.StatusBadRequest, "BadRequest", err.Error())
		return
	}
	block, _ := pem.Decode(body)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		writeStatus(w, http.StatusBadRequest, "BadRequest", "the body is not a PEM CERTIFICATE REQUEST")
		return
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err == nil {
		err = csr.CheckSignature()
	}
	if err != nil {
		writeStatus(w, http.StatusBadRequest, "BadRequest", "certificate request: "+err.Error())
		return
	}
	client, err := s.adminClient(r.Context())
	if err != nil {
		writeStatus(w, http.StatusServiceUnavailable, "ServiceUnavailable", err.Error())
		return
	}
	n, err := client.CoreV1().Nodes().Get(r.Context(), node, metav1.GetOptions{})
	if err != nil {
		writeStatus(w, http.StatusForbidden, "Forbidden", fmt.Sprintf("node %q: %v", node, err))
		return
	}
	if err := checkServingRequest(csr, n); err != nil {
		writeStatus(w, http.StatusForbidden, "Forbidden", err.Error())
		return
	}
	_, ca, caKey, err := s.clusterCA()
	if err != nil {
		writeStatus(w, http.StatusServiceUnavailable, "ServiceUnavailable", err.Error())
		return
	}
	der, err := signLeaf(ca, caKey, csr.PublicKey, csr.Subject, csr.DNSNames, csr.IPAddresses, x509.ExtKeyUsageServerAuth, agentServingCertLifetime)
	if err != nil {
		writeStatus(w, http.StatusInternalServerError, "InternalError", err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/x-pem-file")
	pem.Encode(w, &pem.Block{Type: "CERTIFICATE", Bytes: der})
	pem.Encode(w, &pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw})
}

// checkServingRequest holds a node's request to the names of that node: CN system:node:<name> in
// system:nodes, DNS names among its name and hostname addresses, IP addresses among its IP addresses.
func checkServingRequest(csr *x509.CertificateRequest, node *corev1.Node) error {
	if csr.Subject.CommonName != "system:node:"+node.Name || !slices.Equal(csr.Subject.Organization, []string{"system:nodes"}) {
		return fmt.Errorf("the request's subject must be CN=system:node:%s, O=system:nodes", node.Name)
	}
	if len(csr.EmailAddresses) > 0 || len(csr.URIs) > 0 {
		return fmt.Errorf("the request may not name email addresses or URIs")
	}
	names, ips := []string{node.Name}, []string{}
	for _, a := range node.Status.Addresses {
		switch a.Type {
		case corev1.NodeHostName, corev1.NodeInternalDNS, corev1.NodeExternalDNS:
			names = append(names, a.Address)
		case corev1.NodeInternalIP, corev1.NodeExternalIP:
			ips = append(ips, a.Address)
		}
	}
	for _, n := range csr.DNSNames {
		if !slices.Contains(names, n) {
			return fmt.Errorf("DNS name %q is not one of node %s's names %v", n, node.Name, names)
		}
	}
	for _, ip := range csr.IPAddresses {
		if !slices.ContainsFunc(ips, func(a string) bool { return net.ParseIP(a).Equal(ip) }) {
			return fmt.Errorf("IP address %s is not one of node %s's addresses %v", ip, node.Name, ips)
		}
	}
	return nil
}

// signLeaf signs a leaf certificate for a public key with the cluster CA.
func signLeaf(ca *x509.Certificate, caKey *ecdsa.PrivateKey, pub any, subject pkix.Name, dns []string, ips []net.IP, usage x509.ExtKeyUsage, lifetime time.Duration) ([]byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: subject, DNSNames: dns, IPAddresses: ips,
		NotBefore: now.Add(-5 * time.Minute), NotAfter: now.Add(lifetime),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}
	return x509.CreateCertificate(rand.Reader, tmpl, ca, pub, caKey)
}

const agentClientCertLifetime = 30 * 24 * time.Hour

// agentTransport is how this server reaches agents' endpoints: it trusts the cluster CA (agents' serving
// certificates) and presents the agent client certificate. Streams (exec, port-forward) upgrade over it.
func (s *Server) agentTransport(caPEM []byte) *http.Transport {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	certs := &clientCerts{s: s, subject: pkix.Name{CommonName: join.AgentClientCN}, lifetime: agentClientCertLifetime}
	return &http.Transport{
		Proxy:       nil,
		DialContext: (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12, GetClientCertificate: certs.get,
			// HTTP/1.1 only: SPDY and WebSocket upgrades do not run over HTTP/2.
			NextProtos: []string{"http/1.1"}},
		TLSHandshakeTimeout: 10 * time.Second, ResponseHeaderTimeout: time.Minute,
		MaxIdleConnsPerHost: 8, IdleConnTimeout: 90 * time.Second,
	}
}
