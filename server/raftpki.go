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
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/skiff-dev/skiff/gossip"
	"github.com/skiff-dev/skiff/internal/join"
	"github.com/skiff-dev/skiff/raftnode"
)

// The Raft port speaks mutual TLS (raftnode.TLSLayer) with certificates from the cluster CA, so the CA must
// exist before Raft does. The first server of the bootstrap plan (the lowest name among the bootstrap_expect
// servers) draws it; every other server, at bootstrap or joining later, gets it and a certificate from a
// server that has it ("the server join"):
//
//  1. GET join.ServerCAPath over unverified TLS: the CA with its HMAC under the cluster token's secret. The
//     joining server checks the hash its token carries (K10<hash>::), if any, then the HMAC, so a man in the
//     middle cannot slip it a CA of its own.
//  2. POST join.ServerJoinPath over TLS verified with that CA: the token's secret and a certificate request.
//     The answer is the server certificate and the CA's key, which every server holds (it is in the store,
//     and any of them may lead and sign).
//
// The files live under <data_dir>/pki: ca.crt, ca.key, server.crt, server.key.
const (
	serverCertFile = "server.crt"
	serverKeyFile  = "server.key"
	caCertFile     = "ca.crt"
	caKeyFile      = "ca.key"
)

// serverCertLifetime is how long a server's Raft certificate lives; a server signs itself a new one at start
// when less than a third of it is left (it holds the CA key).
const serverCertLifetime = 5 * 365 * 24 * time.Hour

// raftPKI is this server's Raft credentials: raftnode.Credentials.
type raftPKI struct {
	dir string
	mu  sync.Mutex
	ca  *x509.Certificate
	// caPEM and caKeyPEM are the cluster CA; cert is this server's certificate with its key.
	caPEM, caKeyPEM []byte
	caKey           *ecdsa.PrivateKey
	cert            *tls.Certificate
	pool            *x509.CertPool
}

var errNoServerCert = errors.New("this server has no Raft certificate yet: it is waiting for the cluster CA (the server join)")

// RaftCredentials is raftnode.Credentials.
func (p *raftPKI) RaftCredentials() (*tls.Certificate, *x509.CertPool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cert == nil {
		return nil, nil, errNoServerCert
	}
	return p.cert, p.pool, nil
}

// ready says whether the server holds its Raft certificate.
func (p *raftPKI) ready() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cert != nil
}

// signer returns the CA and its key, or an error before the server has them.
func (p *raftPKI) signer() (caPEM []byte, ca *x509.Certificate, key *ecdsa.PrivateKey, keyPEM []byte, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.caKey == nil {
		return nil, nil, nil, nil, errors.New("the cluster CA is not here yet")
	}
	return p.caPEM, p.ca, p.caKey, p.caKeyPEM, nil
}

// load reads the files a previous run wrote; it returns false when some are missing.
func (p *raftPKI) load() (bool, error) {
	files := map[string][]byte{}
	for _, name := range []string{caCertFile, caKeyFile, serverCertFile, serverKeyFile} {
		b, err := os.ReadFile(filepath.Join(p.dir, name))
		if errors.Is(err, os.ErrNotExist) {
			return false, nil
		} else if err != nil {
			return false, err
		}
		files[name] = b
	}
	return true, p.set(files[caCertFile], files[caKeyFile], files[serverCertFile], files[serverKeyFile], false)
}

// set checks and installs a CA and a server certificate, writing them to the files when persist is set.
func (p *raftPKI) set(caPEM, caKeyPEM, certPEM, keyPEM []byte, persist bool) error {
	ca, caKey, err := parseCA(caPEM, caKeyPEM)
	if err != nil {
		return err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("server certificate: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	if _, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: raftnode.ServerName, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return fmt.Errorf("server certificate does not check out against the cluster CA: %w", err)
	}
	if persist {
		if err := os.MkdirAll(p.dir, 0o700); err != nil {
			return err
		}
		for _, f := range []struct {
			name string
			body []byte
		}{{caCertFile, caPEM}, {caKeyFile, caKeyPEM}, {serverKeyFile, keyPEM}, {serverCertFile, certPEM}} {
			if err := writeFileAtomic(filepath.Join(p.dir, f.name), f.body); err != nil {
				return err
			}
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ca, p.caPEM, p.caKey, p.caKeyPEM, p.cert, p.pool = ca, caPEM, caKey, caKeyPEM, &cert, pool
	return nil
}

// renewIfOld signs the server a new certificate with the CA it holds when a third of the old one's life is
// left.
func (p *raftPKI) renewIfOld(name string) error {
	p.mu.Lock()
	leaf := p.cert.Leaf
	p.mu.Unlock()
	if time.Until(leaf.NotAfter) > serverCertLifetime/3 {
		return nil
	}
	return p.issueSelf(name)
}

// issueSelf signs this server's certificate with the CA it holds.
func (p *raftPKI) issueSelf(name string) error {
	caPEM, ca, caKey, caKeyPEM, err := p.signer()
	if err != nil {
		return err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	certPEM, err := signServerCert(ca, caKey, &key.PublicKey, name)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return p.set(caPEM, caKeyPEM, certPEM, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), true)
}

// generate draws a new cluster CA and signs this server's certificate with it: the first server of a new
// cluster does this once.
func (p *raftPKI) generate(name string) error {
	bundle, err := newCA()
	if err != nil {
		return err
	}
	if err := p.setCA(bundle); err != nil {
		return err
	}
	return p.issueSelf(name)
}

// setCA takes the CA (the store's form: certificate PEM, then key PEM) for signing; the server's
// certificate is still to be issued.
func (p *raftPKI) setCA(bundle []byte) error {
	certBlock, rest := pem.Decode(bundle)
	if certBlock == nil {
		return errors.New("cluster CA: not PEM")
	}
	caPEM, keyPEM := pem.EncodeToMemory(certBlock), bytes.TrimSpace(rest)
	ca, caKey, err := parseCA(caPEM, keyPEM)
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ca, p.caPEM, p.caKey, p.caKeyPEM = ca, caPEM, caKey, append(keyPEM, '\n')
	return nil
}

// bundle is the CA in the store's form: the certificate's PEM, then the key's.
func (p *raftPKI) bundle() ([]byte, error) {
	caPEM, _, _, keyPEM, err := p.signer()
	if err != nil {
		return nil, err
	}
	return append(append([]byte{}, caPEM...), keyPEM...), nil
}

func parseCA(caPEM, keyPEM []byte) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	certBlock, _ := pem.Decode(caPEM)
	keyBlock, _ := pem.Decode(keyPEM)
	if certBlock == nil || keyBlock == nil {
		return nil, nil, errors.New("cluster CA: not PEM")
	}
	ca, err := x509.ParseCertificate(certBlock.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("cluster CA: %w", err)
	}
	key, err := x509.ParseECPrivateKey(keyBlock.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("cluster CA key: %w", err)
	}
	return ca, key, nil
}

// signServerCert issues a server's Raft certificate: raftnode.ServerName, for both server and client
// authentication. Its user name, should it be shown to the API, is system:skiff-server:<name> without
// groups, which RBAC grants nothing.
func signServerCert(ca *x509.Certificate, caKey *ecdsa.PrivateKey, pub any, name string) ([]byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	notAfter := now.Add(serverCertLifetime)
	if notAfter.After(ca.NotAfter) {
		notAfter = ca.NotAfter
	}
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "system:skiff-server:" + name},
		DNSNames: []string{raftnode.ServerName}, NotBefore: now.Add(-5 * time.Minute), NotAfter: notAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}, ca, pub, caKey)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// ensureRaftPKI gets this server its Raft certificate, and returns once it has one or ctx ends:
//   - from the files of a previous run;
//   - from the store a snapshot restored (a data dir written before the Raft port spoke TLS);
//   - by the server join, from any server that has the CA;
//   - or, when this server is the first of the bootstrap plan and every other server of the plan answered
//     that it has no CA, by drawing the CA.
func (s *Server) ensureRaftPKI(ctx context.Context) {
	var lastReason string
	for !s.pki.ready() {
		err := s.obtainRaftPKI(ctx)
		if err == nil {
			s.logger.Info("got the Raft certificate", "dir", s.pki.dir)
			return
		}
		if reason := err.Error(); reason != lastReason {
			s.logger.Info("no Raft certificate yet", "reason", reason)
			lastReason = reason
		}
		if !sleepCtx(ctx, 200*time.Millisecond) {
			return
		}
	}
}

func (s *Server) obtainRaftPKI(ctx context.Context) error {
	if bundle, _, err := s.openSecret(clusterCAKey); err == nil {
		if err := s.pki.setCA(bundle); err != nil {
			return err
		}
		return s.pki.issueSelf(s.cfg.Name)
	}
	servers := s.pool.Alive(gossip.RoleServer)
	noCA := map[string]bool{}
	var lastErr error
	for _, m := range servers {
		if m.Name == s.cfg.Name || m.Meta.APIAddr == "" {
			continue
		}
		err := s.serverJoin(ctx, m.Meta.APIAddr)
		if err == nil {
			return nil
		}
		if errors.Is(err, errPeerHasNoCA) {
			noCA[m.Name] = true
		}
		lastErr = fmt.Errorf("server join through %s: %w", m.Name, err)
	}
	if s.node.HasState() {
		return fmt.Errorf("this server has Raft state but no cluster CA: %v", lastErr)
	}
	plan, err := bootstrapPlan(s.cfg.Name, s.cfg.BootstrapExpect, servers)
	if err != nil {
		return err
	}
	if plan[0].ID != s.cfg.Name {
		if lastErr == nil {
			lastErr = fmt.Errorf("waiting for %s, the first server of the bootstrap plan, to draw the cluster CA", plan[0].ID)
		}
		return lastErr
	}
	for _, p := range plan[1:] {
		if !noCA[p.ID] {
			return fmt.Errorf("waiting for %s to say that it has no cluster CA: %v", p.ID, lastErr)
		}
	}
	if err := s.enc.draw(); err != nil {
		return fmt.Errorf("drawing the encryption configuration: %w", err)
	}
	if err := s.pki.generate(s.cfg.Name); err != nil {
		return err
	}
	s.logger.Info("drew the cluster CA: this server is the first of the bootstrap plan")
	return nil
}

var errPeerHasNoCA = errors.New("the server has no cluster CA yet")

// serverJoinRequest is the body of a POST to join.ServerJoinPath.
type serverJoinRequest struct {
	Name   string `json:"name"`
	Secret string `json:"secret"` // the cluster token's secret
	CSR    string `json:"csr"`    // PEM PKCS#10 request; only its public key is used
}

// serverJoinResponse answers it.
type serverJoinResponse struct {
	Certificate string `json:"certificate"`
	CA          string `json:"ca"`
	CAKey       string `json:"caKey"`
	// EncryptionConfig is the cluster's managed EncryptionConfiguration (encryption.go), when it has one.
	EncryptionConfig string `json:"encryptionConfig,omitempty"`
}

// serverJoin runs the joining side of the server join against one server's API address.
func (s *Server) serverJoin(ctx context.Context, apiAddr string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	base := "https://" + apiAddr
	insecure := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	var offered join.CAResponse
	if err := doJSON(ctx, insecure, http.MethodGet, base+join.ServerCAPath, nil, &offered); err != nil {
		return err
	}
	caPEM, err := s.token.Verify(offered)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return errors.New("the CA offered is not PEM")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	csrDER, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: s.cfg.Name}}, key)
	if err != nil {
		return err
	}
	verified := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	req := serverJoinRequest{Name: s.cfg.Name, Secret: s.token.Secret, CSR: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csrDER}))}
	var resp serverJoinResponse
	if err := doJSON(ctx, verified, http.MethodPost, base+join.ServerJoinPath, req, &resp); err != nil {
		return err
	}
	if resp.CA != string(caPEM) {
		return errors.New("the server answered the join with another CA than it offered")
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	// Before the Raft certificate, so that this server reads the store encrypted from its first entry.
	if err := s.enc.receive([]byte(resp.EncryptionConfig)); err != nil {
		return fmt.Errorf("the encryption configuration the server join handed over: %w", err)
	}
	return s.pki.set(caPEM, []byte(resp.CAKey), []byte(resp.Certificate), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), true)
}

// doJSON sends body (when not nil) as JSON and decodes a 200 answer into out. A 503 from a server join
// endpoint means the server has no CA yet.
func doJSON(ctx context.Context, client *http.Client, method, url string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	switch {
	case resp.StatusCode == http.StatusServiceUnavailable:
		return errPeerHasNoCA
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("%s %s: HTTP %d: %s", method, url, resp.StatusCode, bytes.TrimSpace(data))
	}
	return json.Unmarshal(data, out)
}

// serverCAHandler serves the cluster CA with its HMAC under the cluster token's secret (the server join's
// first step), to anyone; 503 before this server has the CA.
func (s *Server) serverCAHandler(w http.ResponseWriter, r *http.Request) {
	caPEM, _, _, _, err := s.pki.signer()
	if err != nil {
		writeStatus(w, http.StatusServiceUnavailable, "ServiceUnavailable", err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(join.CAResponse{CA: string(caPEM), HMAC: join.CAHMAC(s.token.Secret, caPEM)})
}

// serverJoinHandler signs a joining server's Raft certificate when it presents the cluster token's secret.
func (s *Server) serverJoinHandler(w http.ResponseWriter, r *http.Request) {
	var req serverJoinRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<10)).Decode(&req); err != nil {
		writeStatus(w, http.StatusBadRequest, "BadRequest", "the body is not a server join request: "+err.Error())
		return
	}
	if !join.SecretEqual(req.Secret, s.token.Secret) {
		s.logger.Warn("refused a server join: wrong cluster token", "name", req.Name, "remote", r.RemoteAddr)
		writeStatus(w, http.StatusUnauthorized, "Unauthorized", "the cluster token is wrong")
		return
	}
	caPEM, ca, caKey, caKeyPEM, err := s.pki.signer()
	if err != nil {
		writeStatus(w, http.StatusServiceUnavailable, "ServiceUnavailable", err.Error())
		return
	}
	block, _ := pem.Decode([]byte(req.CSR))
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		writeStatus(w, http.StatusBadRequest, "BadRequest", "csr: not a PEM CERTIFICATE REQUEST")
		return
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err == nil {
		err = csr.CheckSignature()
	}
	if err != nil {
		writeStatus(w, http.StatusBadRequest, "BadRequest", "csr: "+err.Error())
		return
	}
	if req.Name == "" {
		writeStatus(w, http.StatusBadRequest, "BadRequest", "name: required")
		return
	}
	certPEM, err := signServerCert(ca, caKey, csr.PublicKey, req.Name)
	if err != nil {
		writeStatus(w, http.StatusInternalServerError, "InternalError", err.Error())
		return
	}
	s.logger.Info("signed a joining server's Raft certificate", "name", req.Name, "remote", r.RemoteAddr)
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(serverJoinResponse{Certificate: string(certPEM), CA: string(caPEM), CAKey: string(caKeyPEM),
		EncryptionConfig: string(s.enc.managedFile())})
}

// RaftLayer is the Raft port's layer for a tool that runs beside a server, as root, with its data dir: it
// presents that server's certificate (benchmarks' raw store clients use it).
func RaftLayer(dataDir string) (raftnode.Layer, error) {
	p := &raftPKI{dir: filepath.Join(dataDir, signingCADir)}
	loaded, err := p.load()
	if err != nil {
		return nil, err
	}
	if !loaded {
		return nil, fmt.Errorf("no Raft certificate under %s yet", p.dir)
	}
	return raftnode.TLSLayer{Creds: p}, nil
}
