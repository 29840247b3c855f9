package apiserver

import (
	"context"
	"crypto/subtle"
	"net/http"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/group"
	"k8s.io/apiserver/pkg/authentication/request/bearertoken"
	"k8s.io/apiserver/pkg/authentication/request/union"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"

	"github.com/skiff-dev/skiff/internal/join"
)

// adminUser is who the admin token authenticates as: a member of system:masters, as kubeadm's admin is.
const adminUser = "skiff-admin"

// requestAuthenticator authenticates the cluster's admin bearer token, node agents' join tokens and service
// account tokens; a request without credentials is anonymous, and a request with a wrong token is refused
// (401), as kube-apiserver does. A later issue adds client certificates to the union.
func requestAuthenticator(adminToken string, joinToken func() string, saTokens *serviceAccountTokens) authenticator.Request {
	anonymous := authenticator.RequestFunc(func(*http.Request) (*authenticator.Response, bool, error) {
		return &authenticator.Response{User: &user.DefaultInfo{Name: user.Anonymous, Groups: []string{user.AllUnauthenticated}}}, true, nil
	})
	// Every authenticated user is in system:authenticated, added as kube-apiserver adds it.
	return union.NewFailOnError(group.NewAuthenticatedGroupAdder(tokenAuthenticator(adminToken, joinToken, saTokens)), anonymous)
}

// tokenAuthenticator maps the admin token to a system:masters user, and an agent's "node:<name>:<join
// token>" to system:node:<name> in system:nodes, as kubelets are known in Kubernetes, and a service account
// token to system:serviceaccount:<namespace>:<name>.
func tokenAuthenticator(adminToken string, joinToken func() string, saTokens *serviceAccountTokens) authenticator.Request {
	return bearertoken.New(authenticator.TokenFunc(func(ctx context.Context, token string) (*authenticator.Response, bool, error) {
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
		want := joinToken()
		if want == "" || subtle.ConstantTimeCompare([]byte(secret), []byte(want)) != 1 || len(validation.IsDNS1123Subdomain(node)) > 0 {
			return nil, false, nil
		}
		return &authenticator.Response{User: &user.DefaultInfo{
			Name: "system:node:" + node, Groups: []string{"system:nodes", user.AllAuthenticated},
		}}, true, nil
	}))
}

// publicPaths are readable without credentials, as kube-apiserver's system:public-info-viewer role allows;
// the cluster CA is public too (agents check it with the join token before trusting it).
var publicPaths = []string{"/livez", "/readyz", "/healthz", "/version", join.CAPath}

// authenticatedAuthorizer allows every authenticated user (impersonation only to system:masters), and anyone to read the health and version
// endpoints. It is the plug point where a later issue puts RBAC and the Node authorizer.
var authenticatedAuthorizer = authorizer.AuthorizerFunc(func(ctx context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	if !a.IsResourceRequest() && a.GetVerb() == "get" {
		for _, p := range publicPaths {
			if a.GetPath() == p || strings.HasPrefix(a.GetPath(), p+"/") {
				return authorizer.DecisionAllow, "", nil
			}
		}
	}
	u := a.GetUser()
	if u == nil {
		return authorizer.DecisionNoOpinion, "only authenticated users are allowed", nil
	}
	groups := u.GetGroups()
	if slices.Contains(groups, user.SystemPrivilegedGroup) {
		return authorizer.DecisionAllow, "", nil
	}
	// Impersonating someone is as strong as being them: only cluster administrators may.
	if a.GetVerb() == "impersonate" {
		return authorizer.DecisionNoOpinion, "only system:masters may impersonate", nil
	}
	// Until RBAC is enforced, a service account token must not mint others: a short-lived, pod-bound token
	// would otherwise buy an unbound one for any account, for as long as it asks.
	if a.IsResourceRequest() && a.GetResource() == "serviceaccounts" && a.GetSubresource() == "token" &&
		strings.HasPrefix(u.GetName(), serviceaccount.ServiceAccountUsernamePrefix) {
		return authorizer.DecisionNoOpinion, "service accounts may not request service account tokens", nil
	}
	if slices.Contains(groups, user.AllAuthenticated) {
		return authorizer.DecisionAllow, "", nil
	}
	return authorizer.DecisionNoOpinion, "only authenticated users are allowed", nil
})
