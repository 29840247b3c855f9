package apiserver

import (
	"context"
	"crypto/subtle"
	"net/http"
	"strings"

	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/request/bearertoken"
	"k8s.io/apiserver/pkg/authentication/request/union"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
)

// adminUser is who the admin token authenticates as: a member of system:masters, as kubeadm's admin is.
const adminUser = "skiff-admin"

// requestAuthenticator authenticates the cluster's admin bearer token; a request without credentials is
// anonymous, and a request with a wrong token is refused (401), as kube-apiserver does. Later issues add
// client certificates and service account tokens to the union.
func requestAuthenticator(adminToken string) authenticator.Request {
	anonymous := authenticator.RequestFunc(func(*http.Request) (*authenticator.Response, bool, error) {
		return &authenticator.Response{User: &user.DefaultInfo{Name: user.Anonymous, Groups: []string{user.AllUnauthenticated}}}, true, nil
	})
	return union.NewFailOnError(tokenAuthenticator(adminToken), anonymous)
}

func tokenAuthenticator(adminToken string) authenticator.Request {
	return bearertoken.New(authenticator.TokenFunc(func(ctx context.Context, token string) (*authenticator.Response, bool, error) {
		if subtle.ConstantTimeCompare([]byte(token), []byte(adminToken)) != 1 {
			return nil, false, nil
		}
		return &authenticator.Response{User: &user.DefaultInfo{
			Name: adminUser, Groups: []string{user.SystemPrivilegedGroup, user.AllAuthenticated},
		}}, true, nil
	}))
}

// publicPaths are readable without credentials, as kube-apiserver's system:public-info-viewer role allows.
var publicPaths = []string{"/livez", "/readyz", "/healthz", "/version"}

// authenticatedAuthorizer allows every authenticated user, and anyone to read the health and version
// endpoints. It is the plug point where a later issue puts RBAC and the Node authorizer.
var authenticatedAuthorizer = authorizer.AuthorizerFunc(func(ctx context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
	if !a.IsResourceRequest() && a.GetVerb() == "get" {
		for _, p := range publicPaths {
			if a.GetPath() == p || strings.HasPrefix(a.GetPath(), p+"/") {
				return authorizer.DecisionAllow, "", nil
			}
		}
	}
	if u := a.GetUser(); u != nil {
		for _, g := range u.GetGroups() {
			if g == user.AllAuthenticated || g == user.SystemPrivilegedGroup {
				return authorizer.DecisionAllow, "", nil
			}
		}
	}
	return authorizer.DecisionNoOpinion, "only authenticated users are allowed", nil
})
