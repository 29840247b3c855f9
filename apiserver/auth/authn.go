package auth

import (
	"context"
	"crypto/subtle"
	"net/http"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/group"
	"k8s.io/apiserver/pkg/authentication/request/bearertoken"
	"k8s.io/apiserver/pkg/authentication/request/union"
	x509request "k8s.io/apiserver/pkg/authentication/request/x509"
	tokencache "k8s.io/apiserver/pkg/authentication/token/cache"
	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/skiff-dev/skiff/internal/join"
)

// adminUser is who the admin token authenticates as: a member of system:masters, as kubeadm's admin is.
const adminUser = "skiff-admin"

// RequestAuthenticator authenticates client certificates issued by the cluster CA (CN the user, O its
// groups, as Kubernetes reads them), the cluster's admin bearer token, node agents' join tokens and service
// account tokens; a request without credentials is anonymous, and a request with a wrong token is refused
// (401), as kube-apiserver does.
func RequestAuthenticator(clientCA x509request.VerifyOptionFunc, adminToken string, joinToken func() string, saTokens *ServiceAccountTokens) authenticator.Request {
	// Anonymous requests are allowed on the public paths only, as kube-apiserver's anonymous
	// authenticator restricted to its configurable endpoints: anywhere else they are 401, not 403.
	anonymous := authenticator.RequestFunc(func(r *http.Request) (*authenticator.Response, bool, error) {
		if !isPublicPath(r.URL.Path) {
			return nil, false, nil
		}
		return &authenticator.Response{User: &user.DefaultInfo{Name: user.Anonymous, Groups: []string{user.AllUnauthenticated}}}, true, nil
	})
	// Every authenticated user is in system:authenticated, added as kube-apiserver adds it.
	certs := x509request.NewDynamic(clientCA, x509request.CommonNameUserConversion)
	// Token answers are cached as kube-apiserver caches them (--authentication-token-success-cache-ttl,
	// 10 s; failures are not cached): a service account token is otherwise verified, and its pod looked up,
	// on every request.
	tokens := bearertoken.New(tokencache.New(TokenAuthenticator(adminToken, joinToken, saTokens), true, tokenSuccessCacheTTL, 0))
	return union.NewFailOnError(group.NewAuthenticatedGroupAdder(union.New(certs, tokens)), anonymous)
}

// tokenSuccessCacheTTL is how long a token's authentication is remembered: kube-apiserver's default.
const tokenSuccessCacheTTL = 10 * time.Second

// BootstrappersGroup is the group of the join token's users, as of Kubernetes' bootstrap tokens: they may ask
// for a node client certificate through the CSR API, and do nothing else.
const BootstrappersGroup = "system:bootstrappers"

// TokenAuthenticator maps the admin token to a system:masters user, an agent's "node:<name>:<join token>"
// to the bootstrap user system:bootstrap:<name> in system:bootstrappers (the agent then acts as
// system:node:<name> with the client certificate it gets through the CSR API, as a kubelet does after TLS
// bootstrap), and a service account token to system:serviceaccount:<namespace>:<name>. TokenReviews ask it
// too.
func TokenAuthenticator(adminToken string, joinToken func() string, saTokens *ServiceAccountTokens) authenticator.Token {
	return authenticator.TokenFunc(func(ctx context.Context, token string) (*authenticator.Response, bool, error) {
		if subtle.ConstantTimeCompare([]byte(token), []byte(adminToken)) == 1 {
			return &authenticator.Response{User: &user.DefaultInfo{
				Name: adminUser, Groups: []string{user.SystemPrivilegedGroup, user.AllAuthenticated},
			}}, true, nil
		}
		if resp, ok, err := saTokens.authenticate(ctx, token); ok || err != nil {
			return resp, ok, err
		}
		node, secret, ok := join.ParseBearerToken(token)
		if !ok || joinToken == nil {
			return nil, false, nil
		}
		// The token as the server wrote it (K10<CA hash>::<secret>) works as well as its secret.
		if tok, err := join.ParseToken(secret); err == nil {
			secret = tok.Secret
		}
		want := joinToken()
		if want == "" || subtle.ConstantTimeCompare([]byte(secret), []byte(want)) != 1 || len(validation.IsDNS1123Subdomain(node)) > 0 {
			return nil, false, nil
		}
		return &authenticator.Response{User: &user.DefaultInfo{
			Name: "system:bootstrap:" + node, Groups: []string{BootstrappersGroup, user.AllAuthenticated},
		}}, true, nil
	})
}

// WithAuthenticatedGroup adds system:authenticated to the users a token authenticator answers, as the request
// chain does, for TokenReviews.
func WithAuthenticatedGroup(tokens authenticator.Token) authenticator.Token {
	return authenticator.TokenFunc(func(ctx context.Context, token string) (*authenticator.Response, bool, error) {
		resp, ok, err := tokens.AuthenticateToken(ctx, token)
		if !ok || err != nil || slices.Contains(resp.User.GetGroups(), user.AllAuthenticated) {
			return resp, ok, err
		}
		u := resp.User
		resp.User = &user.DefaultInfo{Name: u.GetName(), UID: u.GetUID(), Extra: u.GetExtra(),
			Groups: append(slices.Clip(u.GetGroups()), user.AllAuthenticated)}
		return resp, true, nil
	})
}
