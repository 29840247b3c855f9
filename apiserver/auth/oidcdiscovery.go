package auth

import (
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"net/http"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/endpoints/handlers/responsewriters"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/kubernetes/pkg/serviceaccount"
)

// Service account issuer discovery: the OpenID Connect discovery document and the key set that verify the
// cluster's service account tokens, served as kube-apiserver serves them (its own OpenID metadata provider
// builds both), so that a workload or an outside party (a cloud's workload identity, Vault) can check a
// token with any OIDC library. The documents are behind authentication and authorization like every path;
// the system:service-account-issuer-discovery ClusterRole grants them.
//
// The issuer is the in-cluster name of the API, so the key set's URL is given under it too: whoever can
// resolve the issuer (every pod) can fetch the keys. kube-apiserver puts its external address there unless
// told otherwise (--service-account-jwks-uri); Skiff's servers have several addresses and one issuer.

// keyID is Kubernetes' key ID for a public key: the unpadded base64url SHA-256 of its DER form. Tokens carry
// it in their "kid" header, and the key set names the key by it.
func keyID(pub *ecdsa.PublicKey) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(der)
	return base64.RawURLEncoding.EncodeToString(sum[:]), nil
}

// issuerKeys hands kube's metadata provider the cluster's one signing key.
type issuerKeys struct {
	key func() (*ecdsa.PrivateKey, error)
}

func (k issuerKeys) AddListener(serviceaccount.Listener) {} // the key never changes once it exists
func (k issuerKeys) GetCacheAgeMaxSeconds() int          { return 3600 }
func (k issuerKeys) GetPublicKeys(context.Context, string) []serviceaccount.PublicKey {
	key, err := k.key()
	if err != nil {
		return nil
	}
	id, err := keyID(&key.PublicKey)
	if err != nil {
		return nil
	}
	return []serviceaccount.PublicKey{{KeyID: id, PublicKey: &key.PublicKey}}
}

// IssuerDiscoveryHandlers are the handlers of /.well-known/openid-configuration and /openid/v1/jwks. Until
// the signing key exists (a new cluster's first moments) they answer 503.
func (t *ServiceAccountTokens) IssuerDiscoveryHandlers() map[string]http.Handler {
	var (
		mu       sync.Mutex
		provider serviceaccount.OpenIDMetadataProvider
	)
	get := func() (serviceaccount.OpenIDMetadataProvider, error) {
		mu.Lock()
		defer mu.Unlock()
		if provider != nil {
			return provider, nil
		}
		if t.key == nil {
			return nil, fmt.Errorf("this server issues no service account tokens")
		}
		p, err := serviceaccount.NewOpenIDMetadataProvider(ServiceAccountIssuer, ServiceAccountIssuer+serviceaccount.JWKSPath, "", issuerKeys{t.key})
		if err != nil {
			return nil, err
		}
		provider = p
		return p, nil
	}
	serve := func(contentType string, document func(serviceaccount.OpenIDMetadataProvider) ([]byte, int)) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodGet && r.Method != http.MethodHead {
				w.Header().Set("Allow", "GET, HEAD")
				http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
				return
			}
			p, err := get()
			if err != nil {
				responsewriters.ErrorNegotiated(apierrors.NewServiceUnavailable("service account issuer discovery: "+err.Error()),
					scheme.Codecs, schema.GroupVersion{Version: "v1"}, w, r)
				return
			}
			body, maxAge := document(p)
			w.Header().Set("Content-Type", contentType)
			w.Header().Set("Cache-Control", fmt.Sprintf("public, max-age=%d", maxAge))
			w.Write(body)
		})
	}
	return map[string]http.Handler{
		serviceaccount.OpenIDConfigPath: serve("application/json", serviceaccount.OpenIDMetadataProvider.GetConfigJSON),
		serviceaccount.JWKSPath:         serve("application/jwk-set+json", serviceaccount.OpenIDMetadataProvider.GetKeysetJSON),
	}
}
