package nodeagent

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"k8s.io/client-go/rest"

	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/internal/join"
)

// ErrJoinRefused means the servers refused the agent's credentials: the join token is wrong.
var ErrJoinRefused = errors.New("the servers refused the join token (HTTP 401): check agent.token against a server's <data_dir>/join-token")

// restConfig returns the API client configuration of a node: the cluster CA (from ca_file, or fetched from a
// server and checked against the join token), the node's bearer token, and a dialer that fails over between
// the configured servers.
func restConfig(ctx context.Context, cfg *config.Agent, node string, servers func() []string) (*rest.Config, error) {
	var caPEM []byte
	var err error
	if cfg.CAFile != "" {
		if caPEM, err = os.ReadFile(cfg.CAFile); err != nil {
			return nil, fmt.Errorf("reading agent.ca_file: %w", err)
		}
	} else if caPEM, err = fetchCA(ctx, cfg, servers); err != nil {
		return nil, err
	}
	dialer := &net.Dialer{Timeout: 2 * time.Second}
	return &rest.Config{
		Host:        "https://" + servers()[0],
		BearerToken: join.BearerToken(node, cfg.Token),
		// Every server's certificate names "kubernetes", whichever address the dialer reached.
		TLSClientConfig: rest.TLSClientConfig{CAData: caPEM, ServerName: "kubernetes"},
		UserAgent:       "skiff-agent/" + cfg.Name,
		QPS:             50, Burst: 100,
		Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var last error
			for _, addr := range servers() {
				conn, err := dialer.DialContext(ctx, network, addr)
				if err == nil {
					return conn, nil
				}
				last = err
			}
			return nil, last
		},
	}, nil
}

// fetchCA asks the servers, in turn and until ctx ends, for the cluster CA, and checks it against the join
// token. A CA that fails the check stops the agent: retrying cannot fix a wrong token.
func fetchCA(ctx context.Context, cfg *config.Agent, servers func() []string) ([]byte, error) {
	// The CA is not known yet, so the TLS is unverified; the HMAC under the join token is what vouches for it.
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	for {
		for _, server := range servers() {
			ca, err := fetchCAFrom(ctx, client, server, cfg.Token)
			if err == nil || errors.Is(err, join.ErrCAMismatch) {
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
	return join.VerifyCA(token, body)
}
