package server

import (
	"context"
	"net/http"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// kcClient sends requests as the admin kubeconfig describes, through client-go's own loader, so the test
// fails if the kubeconfig is one kubectl would not accept.
type kcClient struct {
	host  string
	token string
	hc    *http.Client
	// bare trusts the same CA but presents no client certificate.
	bare *http.Client
}

// withoutCert is the client with no client certificate: only its token, if any, says who it is.
func (c *kcClient) withoutCert() *kcClient {
	return &kcClient{host: c.host, token: c.token, hc: c.bare, bare: c.bare}
}

func loadKubeconfigClient(path string) (*kcClient, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, err
	}
	token := cfg.BearerToken
	cfg.BearerToken = ""
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	bare, err := rest.HTTPClientFor(rest.AnonymousClientConfig(cfg))
	if err != nil {
		return nil, err
	}
	return &kcClient{host: cfg.Host, token: token, hc: hc, bare: bare}, nil
}

func (c *kcClient) get(ctx context.Context, path string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", c.host+path, nil)
	if err != nil {
		return 0, err
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}
