package nodeagent

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"k8s.io/client-go/kubernetes"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-streaming/pkg/streaming"

	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/internal/join"
)

// The agent's HTTPS endpoint is what the kubelet's port 10250 is to kube-apiserver: the servers proxy pods'
// logs, exec, attach and port-forward to it, and read resource metrics from it. Its serving certificate is
// issued by the cluster CA for the node's name and address (join.ServingCertPath); it serves only clients
// with the servers' certificate (join.AgentClientCN from the cluster CA): no certificate is 401, another
// identity 403.

// servingCertFiles keep the endpoint's certificate across restarts.
const (
	servingCertFile = "agent-serving.crt"
	servingKeyFile  = "agent-serving.key"
)

// endpoint serves the agent's HTTPS port.
type endpoint struct {
	cfg     *config.Agent
	logger  hclog.Logger
	client  kubernetes.Interface
	caPEM   []byte
	rt      *containerdRuntime
	pods    podLookup
	streams streaming.Server
	metrics http.Handler // the resource metrics, /metrics/resource

	mu   sync.Mutex
	cert *tls.Certificate
}

// serve listens on the agent port until ctx ends. A port that cannot be bound stops the agent, as it stops
// the kubelet: without it no log or exec reaches the node.
func (e *endpoint) serve(ctx context.Context) error {
	if err := e.ensureCert(ctx); err != nil {
		return err
	}
	clientCAs := x509.NewCertPool()
	clientCAs.AppendCertsFromPEM(e.caPEM)
	addr := net.JoinHostPort(e.cfg.BindAddr, strconv.Itoa(e.cfg.AgentPort))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listening on the agent port %s (ports.agent): %w", addr, err)
	}
	srv := &http.Server{
		Handler: e.routes(),
		TLSConfig: &tls.Config{
			MinVersion: tls.VersionTLS12, ClientCAs: clientCAs,
			// Verified when given, so that a request without one gets a 401 it can read, not a handshake error.
			ClientAuth:     tls.VerifyClientCertIfGiven,
			GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return e.currentCert(), nil },
			NextProtos:     []string{"http/1.1"}, // streams upgrade over HTTP/1.1 only
		},
		ReadHeaderTimeout: 30 * time.Second,
		ErrorLog:          e.logger.StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true}),
	}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
		_ = srv.Close() // hijacked streams end with their connections
	}()
	go e.renewCert(ctx)
	e.logger.Info("serving the agent endpoint", "address", addr)
	if err := srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// routes are the kubelet's paths for what the servers proxy.
func (e *endpoint) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok")) })
	mux.HandleFunc("GET /containerLogs/{namespace}/{pod}/{container}", e.containerLogs)
	for op, path := range map[string]string{"exec": "/exec/{namespace}/{pod}/{container}", "attach": "/attach/{namespace}/{pod}/{container}",
		"portForward": "/portForward/{namespace}/{pod}"} {
		mux.HandleFunc("GET "+path, e.stream(op))
		mux.HandleFunc("POST "+path, e.stream(op))
	}
	if e.metrics != nil {
		mux.Handle("GET /metrics/resource", e.metrics)
	}
	return serversOnly(mux)
}

// serversOnly admits the servers' client certificate alone.
func serversOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 {
			http.Error(w, "Unauthorized: the agent endpoint needs the servers' client certificate", http.StatusUnauthorized)
			return
		}
		if cn := r.TLS.VerifiedChains[0][0].Subject.CommonName; cn != join.AgentClientCN {
			http.Error(w, fmt.Sprintf("Forbidden: %q may not use the agent endpoint", cn), http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// stream hands exec, attach and port-forward to the CRI streaming server: the request is registered with it
// (as a CRI runtime's Exec call would) and served at once in this process under the token it returns.
func (e *endpoint) stream(op string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { e.serveStream(op, w, r) }
}

func (e *endpoint) serveStream(op string, w http.ResponseWriter, r *http.Request) {
	pod, err := e.pods.pod(r.PathValue("namespace"), r.PathValue("pod"))
	if err != nil {
		writeError(w, err)
		return
	}
	q := r.URL.Query()
	flag := func(key string) bool { v, _ := strconv.ParseBool(q.Get(key)); return v }
	var target string
	switch op {
	case "portForward":
		ports := []int32{}
		for _, p := range q["port"] {
			n, err := strconv.ParseInt(p, 10, 32)
			if err != nil || n < 1 || n > 65535 {
				http.Error(w, fmt.Sprintf("invalid port %q", p), http.StatusBadRequest)
				return
			}
			ports = append(ports, int32(n))
		}
		resp, err := e.streams.GetPortForward(&runtimeapi.PortForwardRequest{PodSandboxId: string(pod.UID), Port: ports})
		if err != nil {
			writeError(w, err)
			return
		}
		target = resp.Url
	default:
		id, err := runningContainerID(pod, r.PathValue("container"))
		if err != nil {
			// The status this agent last saw may lag behind a container that has just started (`kubectl
			// debug` attaches as soon as the status the servers hold says it runs): ask containerd.
			latest, running := e.rt.latestAttempt(r.Context(), pod, r.PathValue("container"))
			if !running {
				writeError(w, err)
				return
			}
			id = latest
		}
		tty := flag("tty")
		stdin, stdout, stderr := flag("input"), flag("output"), flag("error") && !tty
		if op == "exec" {
			resp, err := e.streams.GetExec(&runtimeapi.ExecRequest{ContainerId: id, Cmd: q["command"], Tty: tty, Stdin: stdin, Stdout: stdout, Stderr: stderr})
			if err != nil {
				writeError(w, err)
				return
			}
			target = resp.Url
		} else {
			resp, err := e.streams.GetAttach(&runtimeapi.AttachRequest{ContainerId: id, Tty: tty, Stdin: stdin, Stdout: stdout, Stderr: stderr})
			if err != nil {
				writeError(w, err)
				return
			}
			target = resp.Url
		}
	}
	u, err := url.Parse(target)
	if err != nil {
		writeError(w, err)
		return
	}
	// The stream's context ends when its connection closes (a client that went away): the runtime then
	// kills what it started for it.
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	r2 := r.Clone(ctx)
	r2.URL.Path, r2.URL.RawPath = u.Path, ""
	e.streams.ServeHTTP(&cancelOnClose{ResponseWriter: w, cancel: cancel}, r2)
}

// cancelOnClose cancels a stream's context when its hijacked connection closes.
type cancelOnClose struct {
	http.ResponseWriter
	cancel context.CancelFunc
}

func (c *cancelOnClose) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := c.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("the connection cannot be hijacked")
	}
	conn, rw, err := hj.Hijack()
	if err != nil {
		return nil, nil, err
	}
	return &closeNotifyConn{Conn: conn, cancel: c.cancel}, rw, nil
}

func (c *cancelOnClose) Flush() {
	if f, ok := c.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

type closeNotifyConn struct {
	net.Conn
	cancel context.CancelFunc
}

func (c *closeNotifyConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil {
		c.cancel() // the client is gone (or the stream ended)
	}
	return n, err
}

func (c *closeNotifyConn) Close() error {
	c.cancel()
	return c.Conn.Close()
}

// writeError answers with the status an error carries (httpError), else 500.
func writeError(w http.ResponseWriter, err error) {
	var he *httpError
	if errors.As(err, &he) {
		http.Error(w, he.msg, he.code)
		return
	}
	http.Error(w, err.Error(), http.StatusInternalServerError)
}

// httpError is an error with the HTTP status the servers turn into the API's answer (a 400 keeps its message,
// as the kubelet's does; the API words a 404 itself).
type httpError struct {
	code int
	msg  string
}

func (e *httpError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &httpError{code: http.StatusBadRequest, msg: fmt.Sprintf(format, args...)}
}

func notFound(format string, args ...any) error {
	return &httpError{code: http.StatusNotFound, msg: fmt.Sprintf(format, args...)}
}

// currentCert is the serving certificate in use.
func (e *endpoint) currentCert() *tls.Certificate {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cert
}

// ensureCert loads the serving certificate kept in the data dir, or asks the servers for one when there is
// none, it names other addresses, or 80% of its life has passed.
func (e *endpoint) ensureCert(ctx context.Context) error {
	certPath, keyPath := filepath.Join(e.cfg.DataDir, servingCertFile), filepath.Join(e.cfg.DataDir, servingKeyFile)
	if cert, err := tls.LoadX509KeyPair(certPath, keyPath); err == nil && e.certFits(cert.Leaf) {
		e.mu.Lock()
		e.cert = &cert
		e.mu.Unlock()
		return nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.CertificateRequest{
		Subject:  pkix.Name{CommonName: "system:node:" + e.cfg.Name, Organization: []string{"system:nodes"}},
		DNSNames: []string{e.cfg.Name},
	}
	if ip := net.ParseIP(e.cfg.AdvertiseAddr); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		return err
	}
	var certPEM []byte
	for {
		certPEM, err = e.client.CoreV1().RESTClient().Post().AbsPath(join.ServingCertPath).
			SetHeader("Content-Type", "application/pkcs10").
			Body(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})).DoRaw(ctx)
		if err == nil || ctx.Err() != nil {
			break
		}
		e.logger.Warn("asking the servers for the agent serving certificate", "error", err)
		select {
		case <-ctx.Done():
		case <-time.After(2 * time.Second):
		}
	}
	if err != nil {
		return fmt.Errorf("getting the agent serving certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("the servers' agent serving certificate: %w", err)
	}
	for path, data := range map[string][]byte{keyPath: keyPEM, certPath: certPEM} {
		if err := writeFileAtomic(path, data, 0o600); err != nil {
			return err
		}
	}
	e.mu.Lock()
	e.cert = &cert
	e.mu.Unlock()
	return nil
}

// certFits tells whether a kept certificate still serves: it names this node and address and has more than
// a fifth of its life left.
func (e *endpoint) certFits(leaf *x509.Certificate) bool {
	if leaf == nil || leaf.VerifyHostname(e.cfg.Name) != nil {
		return false
	}
	if ip := net.ParseIP(e.cfg.AdvertiseAddr); ip != nil && leaf.VerifyHostname(ip.String()) != nil {
		return false
	}
	life := leaf.NotAfter.Sub(leaf.NotBefore)
	return time.Now().Before(leaf.NotBefore.Add(life * 8 / 10))
}

// renewCert replaces the serving certificate when 80% of its life has passed.
func (e *endpoint) renewCert(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Hour):
		}
		if cert := e.currentCert(); cert != nil && !e.certFits(cert.Leaf) {
			if err := e.ensureCert(ctx); err != nil && ctx.Err() == nil {
				e.logger.Warn("renewing the agent serving certificate", "error", err)
			}
		}
	}
}

func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
