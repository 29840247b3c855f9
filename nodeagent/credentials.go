package nodeagent

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/go-hclog"
	certificatesv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/certificate"
	"k8s.io/client-go/util/connrotation"

	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/internal/join"
)

// ErrJoinRefused means the servers refused the agent's credentials: the join token is wrong.
var ErrJoinRefused = errors.New("the servers refused the join token (HTTP 401): check agent.token against a server's <data_dir>/join-token")

// apiAccess is how the agent reaches the API.
type apiAccess struct {
	config *rest.Config
	caPEM  []byte // the cluster CA
	// clientCertFile holds the node's current client certificate and key (PEM, one file, replaced on
	// renewal), which the node's DNS process reads; empty when the agent acts through a kubeconfig.
	clientCertFile string
}

// clientCertPrefix names the node client certificate's files under <data_dir>/pki, as the kubelet's
// kubelet-client-current.pem.
const clientCertPrefix = "agent-client"

// nodeAccess authenticates the agent as its node, system:node:<name> in system:nodes, by TLS bootstrap as a
// kubelet does:
//  1. Fetch the cluster CA (or read ca_file) and check it against the join token; it is kept under
//     <data_dir>/pki for restarts.
//  2. With no client certificate under <data_dir>/pki yet, present the join token, which makes the agent a
//     bootstrapper (system:bootstrap:<name>) that may only ask for a node client certificate: it submits a
//     CertificateSigningRequest (signer kubernetes.io/kube-apiserver-client-kubelet), which the leader's
//     approver approves and its signer signs. A refused token stops the agent.
//  3. Act with the certificate from then on; client-go's certificate manager renews it (a new key, a CSR
//     as the node itself) when 70-90% of its lifetime has passed, and the agent's connections are closed then
//     so that new ones present the new certificate.
func nodeAccess(ctx context.Context, cfg *config.Agent, node string, servers func() []string, logger hclog.Logger) (*apiAccess, error) {
	dir := filepath.Join(cfg.DataDir, "pki")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	// The CA checked at bootstrap is kept beside the certificate, as a kubelet keeps it in its kubeconfig:
	// a restarted agent needs the join token no more, which may have changed since.
	keptCA := filepath.Join(dir, "ca.crt")
	var caPEM []byte
	var err error
	if cfg.CAFile != "" {
		if caPEM, err = os.ReadFile(cfg.CAFile); err != nil {
			return nil, fmt.Errorf("reading agent.ca_file: %w", err)
		}
	} else if caPEM, err = os.ReadFile(keptCA); err != nil {
		if caPEM, err = fetchCA(ctx, cfg, servers); err != nil {
			return nil, err
		}
		if err := os.WriteFile(keptCA, caPEM, 0o600); err != nil {
			return nil, err
		}
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, errors.New("the cluster CA is not a PEM certificate")
	}
	failover := failoverDialer(servers)
	// Every server's certificate names "kubernetes", whichever address the dialer reached.
	base := &rest.Config{Host: "https://" + servers()[0], UserAgent: "skiff-agent/" + cfg.Name, QPS: 50, Burst: 100}
	bootstrap := rest.CopyConfig(base)
	bootstrap.BearerToken = join.BearerToken(node, joinSecret(cfg))
	bootstrap.TLSClientConfig = rest.TLSClientConfig{CAData: caPEM, ServerName: "kubernetes"}
	bootstrap.Dial = failover

	store, err := certificate.NewFileStore(clientCertPrefix, dir, dir, "", "")
	if err != nil {
		return nil, fmt.Errorf("the node client certificate under %s: %w", dir, err)
	}
	manager, err := certificate.NewManager(&certificate.Config{
		ClientsetFn: func(current *tls.Certificate) (kubernetes.Interface, error) {
			if current == nil {
				return kubernetes.NewForConfig(bootstrap)
			}
			return kubernetes.NewForConfig(withClientCert(base, pool, func() *tls.Certificate { return current }, failover))
		},
		Template:         &x509.CertificateRequest{Subject: pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}}},
		SignerName:       certificatesv1.KubeAPIServerClientKubeletSignerName,
		Usages:           []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
		CertificateStore: store,
		Name:             "node client certificate",
	})
	if err != nil {
		return nil, err
	}
	if manager.Current() == nil {
		if err := checkBootstrapToken(ctx, bootstrap, logger); err != nil {
			return nil, err
		}
	}
	manager.Start()
	context.AfterFunc(ctx, manager.Stop)
	if err := waitForClientCert(ctx, manager, logger); err != nil {
		return nil, err
	}
	// Connections present the certificate current when they were made: close them all when it changes.
	rotating := connrotation.NewDialer(failover)
	go closeOnRenewal(ctx, manager, rotating, 10*time.Second, logger)
	return &apiAccess{
		config: withClientCert(base, pool, manager.Current, rotating.DialContext),
		caPEM:  caPEM, clientCertFile: store.CurrentPath(),
	}, nil
}

// failoverDialer dials the first server that answers, in order.
func failoverDialer(servers func() []string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	dialer := &net.Dialer{Timeout: 2 * time.Second}
	return func(ctx context.Context, network, _ string) (net.Conn, error) {
		// Never (nil, nil): connrotation would wrap the nil connection and panic on its first write.
		last := errors.New("no server address known to dial")
		for _, addr := range servers() {
			conn, err := dialer.DialContext(ctx, network, addr)
			if err == nil {
				return conn, nil
			}
			last = err
		}
		return nil, last
	}
}

// withClientCert is base acting with the client certificate cert returns at each handshake.
func withClientCert(base *rest.Config, pool *x509.CertPool, cert func() *tls.Certificate, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *rest.Config {
	cfg := rest.CopyConfig(base)
	cfg.Transport = utilnet.SetTransportDefaults(&http.Transport{
		DialContext: dial,
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "kubernetes", MinVersion: tls.VersionTLS12,
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
				if c := cert(); c != nil {
					return c, nil
				}
				return &tls.Certificate{}, nil // none: the server answers 401
			}},
	})
	return cfg
}

// checkBootstrapToken waits for the API and checks that it takes the join token: a 401 stops the agent, as
// retrying cannot fix a wrong token.
func checkBootstrapToken(ctx context.Context, bootstrap *rest.Config, logger hclog.Logger) error {
	client, err := kubernetes.NewForConfig(bootstrap)
	if err != nil {
		return err
	}
	for {
		// A bootstrapper may list CSRs (system:node-bootstrapper); 403 means the servers have not
		// reconciled their RBAC policy yet.
		_, err := client.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{Limit: 1})
		if apierrors.IsUnauthorized(err) {
			return ErrJoinRefused
		} else if err == nil {
			return nil
		}
		logger.Warn("waiting for the API to take the join token", "error", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("reaching the API: %w", err)
		case <-time.After(2 * time.Second):
		}
	}
}

// waitForClientCert waits until the certificate manager holds a certificate: at once when one is on disk,
// after the CSR is approved and signed otherwise.
func waitForClientCert(ctx context.Context, manager certificate.Manager, logger hclog.Logger) error {
	start := time.Now()
	warnAt := start.Add(10 * time.Second)
	for manager.Current() == nil {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the node client certificate: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
		if now := time.Now(); now.After(warnAt) {
			warnAt = now.Add(10 * time.Second)
			logger.Warn("still waiting for the node client certificate: its CertificateSigningRequest must be approved and signed (`kubectl get csr`)",
				"waited", now.Sub(start).Round(time.Second))
		}
	}
	logger.Info("node client certificate", "subject", manager.Current().Leaf.Subject.String(), "expires", manager.Current().Leaf.NotAfter)
	return nil
}

// closeOnRenewal closes the dialer's connections whenever the manager's certificate changes, checking every
// period (as the kubelet does), so that no connection outlives the certificate it was made with.
func closeOnRenewal(ctx context.Context, manager certificate.Manager, dialer *connrotation.Dialer, period time.Duration, logger hclog.Logger) {
	last := manager.Current()
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(period):
		}
		if cur := manager.Current(); cur != last {
			last = cur
			logger.Info("node client certificate renewed: reconnecting", "expires", cur.Leaf.NotAfter)
			dialer.CloseAll()
		}
	}
}

// fetchCA asks the servers, in turn and until ctx ends, for the cluster CA, and checks it against the join
// token. A CA that fails the check stops the agent: retrying cannot fix a wrong token.
func fetchCA(ctx context.Context, cfg *config.Agent, servers func() []string) ([]byte, error) {
	// The CA is not known yet, so the TLS is unverified; the HMAC under the join token is what vouches for it.
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	for {
		for _, server := range servers() {
			ca, err := fetchCAFrom(ctx, client, server, cfg.Token)
			if err == nil || errors.Is(err, join.ErrCAMismatch) || errors.Is(err, join.ErrCAHashMismatch) {
				return ca, err
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("fetching the cluster CA from %v: %w", servers(), ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

func fetchCAFrom(ctx context.Context, client *http.Client, server, token string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+server+join.CAPath, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: HTTP %d", server, resp.StatusCode)
	}
	var body join.CAResponse
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("%s: %w", server, err)
	}
	tok, err := join.ParseToken(token)
	if err != nil {
		return nil, err
	}
	return tok.Verify(body)
}

// joinSecret is the join token's secret, without the CA hash it may carry (config has checked its form).
func joinSecret(cfg *config.Agent) string {
	tok, err := join.ParseToken(cfg.Token)
	if err != nil {
		return cfg.Token
	}
	return tok.Secret
}
