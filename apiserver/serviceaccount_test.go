package apiserver_test

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	oidc "github.com/coreos/go-oidc"
	"golang.org/x/oauth2"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/skiff-dev/skiff/apiserver/auth"
	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/internal/servertest"
)

// TestServiceAccountTokenVolumeValidates: the kube-api-access volume the ServiceAccount admission
// (package apiserver/admission) adds to a new pod passes the pod's validation, with its name.
func TestServiceAccountTokenVolumeValidates(t *testing.T) {
	t.Parallel()
	shared := servertest.Shared(t)
	c := shared.Client
	ns := servertest.Namespace(t, shared, "satoken")
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "token"}, Spec: corev1.PodSpec{
		RestartPolicy: corev1.RestartPolicyAlways, Containers: []corev1.Container{{Name: "app", Image: "busybox"}}}}
	var got *corev1.Pod
	// The default account comes with the namespace, from the serviceaccount controller.
	proctest.WaitFor(t, "the pod created", 10*time.Second, func() error {
		var err error
		got, err = c.CoreV1().Pods(ns).Create(context.Background(), pod, metav1.CreateOptions{})
		return err
	})
	for _, v := range got.Spec.Volumes {
		if strings.HasPrefix(v.Name, "kube-api-access-") && v.Projected != nil && len(got.Spec.Containers[0].VolumeMounts) == 1 {
			return
		}
	}
	t.Errorf("pod created without the token volume: volumes %+v, mounts %+v", got.Spec.Volumes, got.Spec.Containers[0].VolumeMounts)
}

// TestServiceAccountIssuerDiscovery checks the issuer's OpenID Connect discovery as the conformance test's
// agnhost does: with go-oidc, through a client that presents a service account token and trusts the
// cluster's CA, it finds the issuer's documents at the issuer's own URL (the in-cluster name, dialled here to
// the server), and verifies a token issued for another audience with the published keys. Without
// credentials the documents are refused.
func TestServiceAccountIssuerDiscovery(t *testing.T) {
	t.Parallel()
	peer := servertest.Shared(t)
	ns := servertest.Namespace(t, peer, "saissuer")
	c, ctx := peer.Client, context.Background()
	proctest.WaitFor(t, "the service account", 10*time.Second, func() error {
		_, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "oidc"}}, metav1.CreateOptions{})
		return err
	})
	token := func(audiences ...string) string {
		tr, err := c.CoreV1().ServiceAccounts(ns).CreateToken(ctx, "oidc", &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{Audiences: audiences}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	apiToken, verifiable := token(), token("oidc-discovery-test")

	// The client a pod's in-cluster config gives: the account's token, the cluster CA, and the issuer's
	// host name resolving to the API.
	cfg := rest.AnonymousClientConfig(peer.Config)
	cfg.BearerToken = apiToken
	server, err := url.Parse(peer.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Dial = func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, server.Host)
	}
	cfg.TLSClientConfig.ServerName = "kubernetes.default.svc.cluster.local"
	rt, err := rest.TransportFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	oidcCtx := context.WithValue(ctx, oauth2.HTTPClient, &http.Client{Transport: rt})

	// Refused to anyone not authenticated; Kubernetes' default policy grants it to every service account.
	anonymous, err := rest.TransportFor(&rest.Config{Host: cfg.Host, Dial: cfg.Dial, TLSClientConfig: cfg.TLSClientConfig})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := oidc.NewProvider(context.WithValue(ctx, oauth2.HTTPClient, &http.Client{Transport: anonymous}), auth.ServiceAccountIssuer); err == nil ||
		!strings.Contains(err.Error(), "401") && !strings.Contains(err.Error(), "403") {
		t.Fatalf("discovery without credentials: %v", err)
	}
	var provider *oidc.Provider
	proctest.WaitFor(t, "the discovery document", 10*time.Second, func() error {
		provider, err = oidc.NewProvider(oidcCtx, auth.ServiceAccountIssuer)
		return err
	})
	var doc struct {
		JWKSURI string   `json:"jwks_uri"`
		Algs    []string `json:"id_token_signing_alg_values_supported"`
	}
	if err := provider.Claims(&doc); err != nil || doc.JWKSURI != auth.ServiceAccountIssuer+"/openid/v1/jwks" || !slices.Equal(doc.Algs, []string{"ES256"}) {
		t.Fatalf("discovery document: %+v, %v", doc, err)
	}
	verifier := provider.Verifier(&oidc.Config{ClientID: "oidc-discovery-test", SupportedSigningAlgs: []string{oidc.ES256}})
	idToken, err := verifier.Verify(oidcCtx, verifiable)
	if err != nil {
		t.Fatalf("verifying a service account token with the published keys: %v", err)
	}
	if idToken.Subject != "system:serviceaccount:"+ns+":oidc" {
		t.Errorf("subject %q", idToken.Subject)
	}
	// A token for another audience is not one for this client.
	if _, err := verifier.Verify(oidcCtx, apiToken); err == nil {
		t.Error("a token for the API's audience verified for oidc-discovery-test")
	}
}
