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
	"encoding/json"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/internal/join"
	rt "github.com/skiff-dev/skiff/raftnode/raftnodetest"
)

// testCA is a cluster CA made by newCA, as the leader makes it.
func testCA(t *testing.T) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	raw, err := newCA()
	if err != nil {
		t.Fatal(err)
	}
	certBlock, rest := pem.Decode(raw)
	keyBlock, _ := pem.Decode(rest)
	if certBlock == nil || keyBlock == nil {
		t.Fatalf("newCA gave no PEM certificate and key: %q", raw)
	}
	cert, err := x509.ParseCertificate(certBlock.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	key, err := x509.ParseECPrivateKey(keyBlock.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func TestCheckServingRequest(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeHostName, Address: "n1.example"},
		{Type: corev1.NodeInternalIP, Address: "10.0.0.5"},
		{Type: corev1.NodeExternalIP, Address: "203.0.113.7"},
		{Type: corev1.NodeInternalDNS, Address: "n1.internal"},
		{Type: corev1.NodeExternalDNS, Address: "n1.public"},
	}}}
	subject := pkix.Name{CommonName: "system:node:n1", Organization: []string{"system:nodes"}}
	ips := func(s ...string) []net.IP {
		var out []net.IP
		for _, a := range s {
			out = append(out, net.ParseIP(a))
		}
		return out
	}
	cases := []struct {
		name    string
		csr     x509.CertificateRequest
		wantErr string // "" when the request is allowed
	}{
		{"name and internal IP", x509.CertificateRequest{Subject: subject, DNSNames: []string{"n1"}, IPAddresses: ips("10.0.0.5")}, ""},
		{"every name and address", x509.CertificateRequest{Subject: subject, DNSNames: []string{"n1", "n1.example", "n1.internal", "n1.public"},
			IPAddresses: ips("10.0.0.5", "203.0.113.7")}, ""},
		{"a 4-byte IP", x509.CertificateRequest{Subject: subject, IPAddresses: []net.IP{net.IPv4(10, 0, 0, 5).To4()}}, ""},
		{"no names", x509.CertificateRequest{Subject: subject}, ""},
		{"another node's CN", x509.CertificateRequest{Subject: pkix.Name{CommonName: "system:node:n2", Organization: []string{"system:nodes"}}, DNSNames: []string{"n1"}},
			"CN=system:node:n1, O=system:nodes"},
		{"bare node name as CN", x509.CertificateRequest{Subject: pkix.Name{CommonName: "n1", Organization: []string{"system:nodes"}}}, "CN=system:node:n1"},
		{"the servers' client CN", x509.CertificateRequest{Subject: pkix.Name{CommonName: join.AgentClientCN, Organization: []string{"system:nodes"}}}, "CN=system:node:n1"},
		{"no organization", x509.CertificateRequest{Subject: pkix.Name{CommonName: "system:node:n1"}}, "O=system:nodes"},
		{"another organization", x509.CertificateRequest{Subject: pkix.Name{CommonName: "system:node:n1", Organization: []string{"system:masters"}}}, "O=system:nodes"},
		{"an extra organization", x509.CertificateRequest{Subject: pkix.Name{CommonName: "system:node:n1", Organization: []string{"system:nodes", "system:masters"}}}, "O=system:nodes"},
		{"another node's DNS name", x509.CertificateRequest{Subject: subject, DNSNames: []string{"n1", "n2"}}, `DNS name "n2" is not one of node n1's names`},
		{"a wildcard", x509.CertificateRequest{Subject: subject, DNSNames: []string{"*.example"}}, `DNS name "*.example"`},
		{"an IP not of the node", x509.CertificateRequest{Subject: subject, IPAddresses: ips("10.0.0.5", "10.0.0.6")}, "IP address 10.0.0.6 is not one of node n1's addresses"},
		{"loopback", x509.CertificateRequest{Subject: subject, IPAddresses: ips("127.0.0.1")}, "IP address 127.0.0.1"},
		{"a host name as an IP", x509.CertificateRequest{Subject: subject, DNSNames: []string{"10.0.0.5"}}, `DNS name "10.0.0.5"`},
		{"an email address", x509.CertificateRequest{Subject: subject, DNSNames: []string{"n1"}, EmailAddresses: []string{"root@n1"}}, "email addresses or URIs"},
		{"a URI", x509.CertificateRequest{Subject: subject, URIs: []*url.URL{{Scheme: "spiffe", Host: "cluster", Path: "/n1"}}}, "email addresses or URIs"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := checkServingRequest(&tc.csr, node)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want one with %q", err, tc.wantErr)
			}
		})
	}
}

func TestSignLeaf(t *testing.T) {
	ca, caKey := testCA(t)
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	cases := []struct {
		name     string
		subject  pkix.Name
		dns      []string
		ips      []net.IP
		usage    x509.ExtKeyUsage
		other    x509.ExtKeyUsage
		lifetime time.Duration
	}{
		{"serving", pkix.Name{CommonName: "system:node:n1", Organization: []string{"system:nodes"}}, []string{"n1"}, []net.IP{net.ParseIP("10.0.0.5")},
			x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth, agentServingCertLifetime},
		{"client", pkix.Name{CommonName: join.AgentClientCN}, nil, nil, x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth, agentClientCertLifetime},
		{"short", pkix.Name{CommonName: "short"}, []string{"short.example"}, nil, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth, time.Hour},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			key := newKey(t)
			before := time.Now()
			der, err := signLeaf(ca, caKey, &key.PublicKey, tc.subject, tc.dns, tc.ips, tc.usage, tc.lifetime)
			if err != nil {
				t.Fatal(err)
			}
			after := time.Now()
			leaf, err := x509.ParseCertificate(der)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{tc.usage}}); err != nil {
				t.Fatalf("does not verify for its usage: %v", err)
			}
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{tc.other}}); err == nil {
				t.Fatal("verifies for another usage")
			}
			if !slices.Equal(leaf.ExtKeyUsage, []x509.ExtKeyUsage{tc.usage}) || leaf.IsCA || leaf.KeyUsage != x509.KeyUsageDigitalSignature {
				t.Errorf("usages %v, key usage %v, CA %v", leaf.ExtKeyUsage, leaf.KeyUsage, leaf.IsCA)
			}
			if leaf.Subject.CommonName != tc.subject.CommonName || !slices.Equal(leaf.Subject.Organization, tc.subject.Organization) {
				t.Errorf("subject %v, want %v", leaf.Subject, tc.subject)
			}
			if !slices.Equal(leaf.DNSNames, tc.dns) || len(leaf.IPAddresses) != len(tc.ips) {
				t.Errorf("names %v %v, want %v %v", leaf.DNSNames, leaf.IPAddresses, tc.dns, tc.ips)
			}
			for i, ip := range tc.ips {
				if !leaf.IPAddresses[i].Equal(ip) {
					t.Errorf("IP %d is %v, want %v", i, leaf.IPAddresses[i], ip)
				}
			}
			if pub, ok := leaf.PublicKey.(*ecdsa.PublicKey); !ok || !pub.Equal(&key.PublicKey) {
				t.Error("the certificate is not for the key given")
			}
			// Valid from a little before now (clock skew), for the lifetime from now. Certificates carry seconds.
			if !leaf.NotBefore.Before(before) || leaf.NotBefore.Before(before.Add(-time.Hour)) {
				t.Errorf("NotBefore %v, signed at %v", leaf.NotBefore, before)
			}
			if leaf.NotAfter.Before(before.Add(tc.lifetime).Add(-time.Second)) || leaf.NotAfter.After(after.Add(tc.lifetime)) {
				t.Errorf("NotAfter %v, want %v from %v", leaf.NotAfter, tc.lifetime, before)
			}
			// Each certificate gets a serial of its own.
			again, err := signLeaf(ca, caKey, &key.PublicKey, tc.subject, tc.dns, tc.ips, tc.usage, tc.lifetime)
			if err != nil {
				t.Fatal(err)
			}
			if second, err := x509.ParseCertificate(again); err != nil || second.SerialNumber.Cmp(leaf.SerialNumber) == 0 {
				t.Errorf("two certificates share serial %v (%v)", leaf.SerialNumber, err)
			}
		})
	}
	// A leaf from another CA does not verify against this one.
	otherCA, otherKey := testCA(t)
	der, err := signLeaf(otherCA, otherKey, &newKey(t).PublicKey, pkix.Name{CommonName: "x"}, nil, nil, x509.ExtKeyUsageClientAuth, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Fatal("a leaf of another CA verifies")
	}
}

// agentCertsPeer starts one server and waits until its API serves and its cluster CA has replicated.
func agentCertsPeer(t *testing.T) (*Server, *kcClient) {
	t.Helper()
	peers := newPeers(t, 1, 1)
	peers[0].start(t)
	t.Cleanup(peers[0].stop)
	waitOneCluster(t, peers, 1)
	s := peers[0].srv
	var kc *kcClient
	rt.WaitFor(t, "admin kubeconfig and CA", 30*time.Second, func() error {
		if _, _, _, err := s.clusterCA(); err != nil {
			return err
		}
		var err error
		kc, err = loadKubeconfigClient(s.KubeconfigPath())
		return err
	})
	return s, kc
}

// TestAgentCertsOnAServer covers what needs a running server: the client certificate the servers present
// to agents and the agent serving certificate endpoint.
func TestAgentCertsOnAServer(t *testing.T) {
	s, kc := agentCertsPeer(t)
	caPEM, ca, _, err := s.clusterCA()
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)

	t.Run("client certificate", func(t *testing.T) {
		certs := &clientCerts{s: s, subject: pkix.Name{CommonName: join.AgentClientCN}, lifetime: agentClientCertLifetime}
		cert, err := certs.get(nil)
		if err != nil {
			t.Fatal(err)
		}
		if cert.Leaf == nil || cert.Leaf.Subject.CommonName != join.AgentClientCN {
			t.Fatalf("leaf %v, want CN %s", cert.Leaf, join.AgentClientCN)
		}
		if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Fatalf("the client certificate does not verify against the cluster CA: %v", err)
		}
		if life := cert.Leaf.NotAfter.Sub(time.Now()); life < agentClientCertLifetime-time.Minute || life > agentClientCertLifetime {
			t.Errorf("the client certificate lives %v more, want about %v", life, agentClientCertLifetime)
		}
		key, ok := cert.PrivateKey.(*ecdsa.PrivateKey)
		if !ok || !key.PublicKey.Equal(cert.Leaf.PublicKey) || !bytes.Equal(cert.Certificate[0], cert.Leaf.Raw) {
			t.Fatal("the key, the DER and the leaf do not belong together")
		}
		again, err := certs.get(nil)
		if err != nil || again != cert {
			t.Fatalf("a second call issued a new certificate (%v)", err)
		}
		// Past 80% of its life it is issued again.
		aged := *cert.Leaf
		aged.NotBefore = time.Now().Add(-agentClientCertLifetime*8/10 - time.Minute)
		certs.cert = &tls.Certificate{Certificate: cert.Certificate, PrivateKey: cert.PrivateKey, Leaf: &aged}
		renewed, err := certs.get(nil)
		if err != nil {
			t.Fatal(err)
		}
		if renewed.Leaf == &aged || renewed.Leaf.SerialNumber.Cmp(cert.Leaf.SerialNumber) == 0 {
			t.Fatal("an aged certificate was not renewed")
		}
		// Short of 80% it is kept.
		young := *renewed.Leaf
		young.NotBefore = time.Now().Add(-agentClientCertLifetime * 7 / 10)
		kept := &tls.Certificate{Certificate: renewed.Certificate, PrivateKey: renewed.PrivateKey, Leaf: &young}
		certs.cert = kept
		if got, err := certs.get(nil); err != nil || got != kept {
			t.Fatalf("a certificate at 70%% of its life was replaced (%v)", err)
		}
	})

	t.Run("agent transport", func(t *testing.T) {
		// An agent-like endpoint with a serving certificate from the cluster CA that demands a client
		// certificate from the same CA and echoes its CN.
		_, _, caKey, _ := s.clusterCA()
		key := newKey(t)
		der, err := signLeaf(ca, caKey, &key.PublicKey, pkix.Name{CommonName: "system:node:n1"}, []string{"n1"}, []net.IP{net.ParseIP("127.0.0.1")}, x509.ExtKeyUsageServerAuth, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, r.TLS.VerifiedChains[0][0].Subject.CommonName)
		}))
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
			ClientCAs: roots, ClientAuth: tls.RequireAndVerifyClientCert}
		srv.StartTLS()
		t.Cleanup(srv.Close)
		tr := s.agentTransport(caPEM)
		t.Cleanup(tr.CloseIdleConnections)
		resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(srv.URL + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(body) != join.AgentClientCN {
			t.Fatalf("the agent saw %d %q, want the client CN %s", resp.StatusCode, body, join.AgentClientCN)
		}
		if resp.Proto != "HTTP/1.1" {
			t.Errorf("protocol %s, want HTTP/1.1 (streams upgrade)", resp.Proto)
		}
		// A server whose certificate is not from the cluster CA is refused.
		foreign := httptest.NewTLSServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		t.Cleanup(foreign.Close)
		if resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(foreign.URL); err == nil {
			resp.Body.Close()
			t.Fatal("the agent transport trusted a certificate from another CA")
		}
	})

	t.Run("serving certificate endpoint", func(t *testing.T) {
		cfg, err := clientcmd.BuildConfigFromFlags("", s.KubeconfigPath())
		if err != nil {
			t.Fatal(err)
		}
		admin := kubernetes.NewForConfigOrDie(cfg)
		ctx := context.Background()
		for _, n := range []*corev1.Node{
			{ObjectMeta: metav1.ObjectMeta{Name: "agent-1"}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeInternalIP, Address: "127.0.0.2"}, {Type: corev1.NodeHostName, Address: "agent-1.local"}}}},
			{ObjectMeta: metav1.ObjectMeta{Name: "agent-2"}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
				{Type: corev1.NodeInternalIP, Address: "127.0.0.3"}}}},
		} {
			if _, err := admin.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		joinToken := s.joinToken()
		if joinToken == "" {
			t.Fatal("no join token")
		}
		// The bootstrap RBAC policy, which lets nodes ask for serving certificates, is in place once ready.
		rt.WaitFor(t, "readyz", 30*time.Second, func() error {
			_, err := admin.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
			return err
		})
		key := newKey(t)
		csrPEM := func(t *testing.T, cn string, org []string, dns []string, ips ...string) string {
			t.Helper()
			tmpl := &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn, Organization: org}, DNSNames: dns}
			for _, ip := range ips {
				tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(ip))
			}
			der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
			if err != nil {
				t.Fatal(err)
			}
			return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
		}
		nodes := []string{"system:nodes"}
		tampered := func(t *testing.T) string {
			block, _ := pem.Decode([]byte(csrPEM(t, "system:node:agent-1", nodes, []string{"agent-1"})))
			block.Bytes[len(block.Bytes)-1] ^= 0xff // the last byte of the signature
			return string(pem.EncodeToMemory(block))
		}
		const adminCert = "(the admin kubeconfig's certificate)"
		// nodeCert+name is the node's client certificate, as an agent holds after TLS bootstrap.
		const nodeCert = "(a node certificate) "
		_, ca, caKey, err := s.clusterCA()
		if err != nil {
			t.Fatal(err)
		}
		nodeClient := func(t *testing.T, node string) *http.Client {
			t.Helper()
			certPEM, keyPEM, err := issueClientCertPEM(ca, caKey, pkix.Name{CommonName: "system:node:" + node, Organization: nodes}, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			cfg, err := clientcmd.BuildConfigFromFlags("", s.KubeconfigPath())
			if err != nil {
				t.Fatal(err)
			}
			cfg = rest.AnonymousClientConfig(cfg)
			cfg.CertData, cfg.KeyData = certPEM, keyPEM
			hc, err := rest.HTTPClientFor(cfg)
			if err != nil {
				t.Fatal(err)
			}
			return hc
		}
		post := func(t *testing.T, method, bearer, body string) (int, string) {
			t.Helper()
			req, err := http.NewRequest(method, kc.host+join.ServingCertPath, strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			// The admin is known by the kubeconfig's certificate; anyone else by a bearer token or nothing.
			client := kc.bare
			switch {
			case bearer == adminCert:
				client = kc.hc
			case strings.HasPrefix(bearer, nodeCert):
				client = nodeClient(t, strings.TrimPrefix(bearer, nodeCert))
				bearer = ""
			case bearer == "":
			default:
				req.Header.Set("Authorization", "Bearer "+bearer)
			}
			req.Header.Set("Content-Type", "application/pkcs10")
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(raw)
		}
		agent1 := nodeCert + "agent-1"

		t.Run("issued", func(t *testing.T) {
			code, body := post(t, http.MethodPost, agent1, csrPEM(t, "system:node:agent-1", nodes, []string{"agent-1", "agent-1.local"}, "127.0.0.2"))
			if code != http.StatusOK {
				t.Fatalf("POST: %d %s", code, body)
			}
			var chain []*x509.Certificate
			for rest := []byte(body); ; {
				var block *pem.Block
				if block, rest = pem.Decode(rest); block == nil {
					break
				}
				if block.Type != "CERTIFICATE" {
					t.Fatalf("a %s block in the answer", block.Type)
				}
				c, err := x509.ParseCertificate(block.Bytes)
				if err != nil {
					t.Fatal(err)
				}
				chain = append(chain, c)
			}
			if len(chain) != 2 || !chain[1].Equal(ca) {
				t.Fatalf("the answer holds %d certificates, want the leaf then the cluster CA", len(chain))
			}
			leaf := chain[0]
			for _, name := range []string{"agent-1", "agent-1.local", "127.0.0.2"} {
				if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: name, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
					t.Errorf("the leaf does not verify for %s: %v", name, err)
				}
			}
			if !slices.Equal(leaf.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}) {
				t.Errorf("usages %v, want server auth only", leaf.ExtKeyUsage)
			}
			if leaf.Subject.CommonName != "system:node:agent-1" || !key.PublicKey.Equal(leaf.PublicKey) {
				t.Errorf("leaf for %s, or for another key", leaf.Subject)
			}
			if life := time.Until(leaf.NotAfter); life < agentServingCertLifetime-time.Hour || life > agentServingCertLifetime {
				t.Errorf("the leaf lives %v more, want about %v", life, agentServingCertLifetime)
			}
		})

		cases := []struct {
			name     string
			method   string
			bearer   string
			body     func(t *testing.T) string
			wantCode int
			wantMsg  string
		}{
			{"GET", http.MethodGet, agent1, func(*testing.T) string { return "" }, http.StatusForbidden, `cannot get path "/v1/agent/serving-certificate"`},
			{"garbage", http.MethodPost, agent1, func(*testing.T) string { return "not a request" }, http.StatusBadRequest, "not a PEM CERTIFICATE REQUEST"},
			{"a certificate instead", http.MethodPost, agent1, func(*testing.T) string { return string(caPEM) }, http.StatusBadRequest, "not a PEM CERTIFICATE REQUEST"},
			{"PEM of garbage", http.MethodPost, agent1, func(*testing.T) string {
				return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: []byte("junk")}))
			}, http.StatusBadRequest, "certificate request:"},
			{"bad signature", http.MethodPost, agent1, tampered, http.StatusBadRequest, "certificate request:"},
			{"another node's name", http.MethodPost, agent1, func(t *testing.T) string {
				return csrPEM(t, "system:node:agent-2", nodes, []string{"agent-2"}, "127.0.0.3")
			}, http.StatusForbidden, "CN=system:node:agent-1"},
			{"another node's DNS name", http.MethodPost, agent1, func(t *testing.T) string {
				return csrPEM(t, "system:node:agent-1", nodes, []string{"agent-1", "agent-2"})
			}, http.StatusForbidden, `DNS name "agent-2"`},
			{"another node's address", http.MethodPost, agent1, func(t *testing.T) string {
				return csrPEM(t, "system:node:agent-1", nodes, []string{"agent-1"}, "127.0.0.3")
			}, http.StatusForbidden, "IP address 127.0.0.3"},
			{"no organization", http.MethodPost, agent1, func(t *testing.T) string {
				return csrPEM(t, "system:node:agent-1", nil, []string{"agent-1"})
			}, http.StatusForbidden, "O=system:nodes"},
			{"a node without a Node", http.MethodPost, nodeCert + "ghost", func(t *testing.T) string {
				return csrPEM(t, "system:node:ghost", nodes, []string{"ghost"})
			}, http.StatusForbidden, `node "ghost"`},
			{"the admin", http.MethodPost, adminCert, func(t *testing.T) string {
				return csrPEM(t, "system:node:agent-1", nodes, []string{"agent-1"})
			}, http.StatusForbidden, "only a node"},
			{"a wrong join token", http.MethodPost, join.BearerToken("agent-1", "not-the-join-token"), func(t *testing.T) string {
				return csrPEM(t, "system:node:agent-1", nodes, []string{"agent-1"})
			}, http.StatusUnauthorized, ""},
			// The join token only bootstraps: it is not the node.
			{"the join token", http.MethodPost, join.BearerToken("agent-1", joinToken), func(t *testing.T) string {
				return csrPEM(t, "system:node:agent-1", nodes, []string{"agent-1"})
			}, http.StatusForbidden, ""},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				code, body := post(t, tc.method, tc.bearer, tc.body(t))
				var status struct {
					Kind, Message string
					Code          int
				}
				if code != tc.wantCode {
					t.Fatalf("%d %s, want %d", code, body, tc.wantCode)
				}
				if tc.wantMsg == "" {
					return
				}
				if err := json.Unmarshal([]byte(body), &status); err != nil || status.Kind != "Status" || status.Code != code {
					t.Fatalf("not a Status body: %s (%v)", body, err)
				}
				if !strings.Contains(status.Message, tc.wantMsg) {
					t.Fatalf("message %q lacks %q", status.Message, tc.wantMsg)
				}
			})
		}

		// An anonymous request is refused before the handler: only the public paths admit anonymous users.
		code, body := post(t, http.MethodPost, "", csrPEM(t, "system:node:agent-1", nodes, []string{"agent-1"}))
		if code != http.StatusUnauthorized {
			t.Fatalf("anonymous: %d %s, want 401", code, body)
		}
	})
}

// A pod reaches the API as client-go's in-cluster config does, at the kubernetes Service's ClusterIP, or by
// its DNS names: the serving certificate must carry them all, as kube-apiserver's does.
func TestServingCertCarriesInClusterNames(t *testing.T) {
	c := &servingCerts{s: &Server{cfg: &config.Server{Name: "s1", BindAddr: "127.0.0.1", ServiceCIDR: "10.96.0.0/16", ClusterDomain: "cluster.local"}}}
	cert, err := c.issue(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"10.96.0.1", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "127.0.0.1", "s1"} {
		if err := leaf.VerifyHostname(name); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}
