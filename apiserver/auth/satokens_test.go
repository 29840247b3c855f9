package auth_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/skiff-dev/skiff/internal/servertest"
)

// TestServiceAccountTokens: the serviceaccounts/token subresource issues tokens that authenticate on every
// peer while their ServiceAccount (and the pod they are bound to) exist, and refuses bad requests with the
// Kubernetes status and field path.
func TestServiceAccountTokens(t *testing.T) {
	peers := servertest.Start(t, 3)
	admin := peers[0].Client
	ctx := context.Background()
	sa, err := admin.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "robot"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	request := func(name string, spec authenticationv1.TokenRequestSpec, opts metav1.CreateOptions) (*authenticationv1.TokenRequest, error) {
		return admin.CoreV1().ServiceAccounts("default").CreateToken(ctx, name, &authenticationv1.TokenRequest{Spec: spec}, opts)
	}
	// as lists pods with the token, through the given peer, and returns the HTTP status.
	as := func(token string, peer int) int {
		cfg := rest.AnonymousClientConfig(peers[peer].Config)
		cfg.BearerToken = token
		_, err := kubernetes.NewForConfigOrDie(cfg).CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
		if err == nil {
			return http.StatusOK
		}
		if status, ok := err.(apierrors.APIStatus); ok {
			return int(status.Status().Code)
		}
		t.Fatalf("list with a service account token: %v", err)
		return 0
	}

	tr, err := request("robot", authenticationv1.TokenRequestSpec{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Status.Token == "" || strings.Count(tr.Status.Token, ".") != 2 {
		t.Fatalf("token %q is not a JWT", tr.Status.Token)
	}
	if got := time.Until(tr.Status.ExpirationTimestamp.Time); got < 59*time.Minute || got > 61*time.Minute {
		t.Errorf("default token lifetime: expires in %v, want an hour", got)
	}
	if *tr.Spec.ExpirationSeconds != 3600 || len(tr.Spec.Audiences) != 1 {
		t.Errorf("defaulted spec: %+v", tr.Spec)
	}
	// RBAC: nothing until a binding grants it.
	if code := as(tr.Status.Token, 0); code != http.StatusForbidden {
		t.Errorf("token without a binding: status %d, want 403", code)
	}
	if _, err := admin.RbacV1().RoleBindings("default").Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "robot-view"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "view"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "default", Name: "robot"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for peer := range peers {
		// Each peer's RBAC cache sees the binding shortly after it is written.
		code := 0
		for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if code = as(tr.Status.Token, peer); code == http.StatusOK {
				break
			}
		}
		if code != http.StatusOK {
			t.Errorf("token through peer %d: status %d, want 200", peer+1, code)
		}
	}
	// The token's user, as `kubectl auth whoami` reads it.
	cfg := rest.AnonymousClientConfig(peers[1].Config)
	cfg.BearerToken = tr.Status.Token
	review, err := kubernetes.NewForConfigOrDie(cfg).AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if u := review.Status.UserInfo; u.Username != "system:serviceaccount:default:robot" ||
		!slices.Contains(u.Groups, "system:serviceaccounts") || !slices.Contains(u.Groups, "system:serviceaccounts:default") || !slices.Contains(u.Groups, "system:authenticated") {
		t.Errorf("token user: %+v", u)
	}
	// A service account token may not mint more tokens (until RBAC decides it).
	if _, err := kubernetes.NewForConfigOrDie(cfg).CoreV1().ServiceAccounts("default").CreateToken(ctx, "robot",
		&authenticationv1.TokenRequest{}, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("token request with a service account token: %v, want 403", err)
	}
	forged := tr.Status.Token[:len(tr.Status.Token)-4] + "AAAA"
	if code := as(forged, 1); code != http.StatusUnauthorized {
		t.Errorf("token with a bad signature: status %d, want 401", code)
	}

	// Bad requests.
	bad := []struct {
		what  string
		name  string
		spec  authenticationv1.TokenRequestSpec
		code  int32
		field string
	}{
		{"too short a lifetime", "robot", authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(599))}, 422, "spec.expirationSeconds"},
		{"bound to an unsupported kind", "robot", authenticationv1.TokenRequestSpec{BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "ConfigMap", Name: "x"}}, 422, "spec.boundObjectRef.kind"},
		{"bound without a name", "robot", authenticationv1.TokenRequestSpec{BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod"}}, 422, "spec.boundObjectRef.name"},
		{"missing service account", "nobody", authenticationv1.TokenRequestSpec{}, 404, ""},
		{"bound to a missing pod", "robot", authenticationv1.TokenRequestSpec{BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", Name: "gone"}}, 404, ""},
	}
	for _, b := range bad {
		_, err := request(b.name, b.spec, metav1.CreateOptions{})
		status, ok := err.(apierrors.APIStatus)
		if !ok {
			t.Errorf("%s: got %v, want status %d", b.what, err, b.code)
			continue
		}
		if status.Status().Code != b.code {
			t.Errorf("%s: status %d (%v), want %d", b.what, status.Status().Code, err, b.code)
		}
		if b.field != "" && (status.Status().Details == nil || len(status.Status().Details.Causes) == 0 || status.Status().Details.Causes[0].Field != b.field) {
			t.Errorf("%s: causes %+v, want field %s", b.what, status.Status().Details, b.field)
		}
	}
	if dry, err := request("robot", authenticationv1.TokenRequestSpec{}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil || dry.Status.Token != "" {
		t.Errorf("dry run: token %q, error %v; want no token", dry.Status.Token, err)
	}

	// A token bound to a pod lives as long as the pod.
	pod, err := admin.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "bound"},
		Spec:       corev1.PodSpec{ServiceAccountName: "robot", SchedulerName: "none", Containers: []corev1.Container{{Name: "c", Image: "i"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other, err := admin.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "other-account"},
		Spec:       corev1.PodSpec{SchedulerName: "none", Containers: []corev1.Container{{Name: "c", Image: "i"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := request("robot", authenticationv1.TokenRequestSpec{BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", Name: other.Name}}, metav1.CreateOptions{}); !apierrors.IsBadRequest(err) {
		t.Errorf("token bound to a pod of another account: %v, want 400", err)
	}
	if _, err := request("robot", authenticationv1.TokenRequestSpec{BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", Name: pod.Name, UID: "not-its-uid"}}, metav1.CreateOptions{}); !apierrors.IsConflict(err) {
		t.Errorf("token bound to a pod with the wrong UID: %v, want 409", err)
	}
	boundTR, err := request("robot", authenticationv1.TokenRequestSpec{BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", Name: pod.Name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if boundTR.Spec.BoundObjectRef.UID != pod.UID {
		t.Errorf("bound reference UID %q, want the pod's %q", boundTR.Spec.BoundObjectRef.UID, pod.UID)
	}
	if code := as(boundTR.Status.Token, 2); code != http.StatusOK {
		t.Errorf("pod-bound token: status %d, want 200", code)
	}
	// A token bound to a pod on a node names the node, which a TokenReview reports (and which is no
	// binding: the node's deletion does not revoke it).
	node, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	placed, err := admin.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "placed"},
		Spec:       corev1.PodSpec{ServiceAccountName: "robot", NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "i"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	placedTR, err := request("robot", authenticationv1.TokenRequestSpec{BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", Name: placed.Name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tokenReview, err := admin.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: placedTR.Status.Token}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	extra := tokenReview.Status.User.Extra
	if !tokenReview.Status.Authenticated || !slices.Equal(extra["authentication.kubernetes.io/node-name"], []string{"n1"}) ||
		!slices.Equal(extra["authentication.kubernetes.io/node-uid"], []string{string(node.UID)}) ||
		!slices.Equal(extra["authentication.kubernetes.io/pod-name"], []string{"placed"}) {
		t.Errorf("review of a token of a pod on n1: authenticated %v, extra %v", tokenReview.Status.Authenticated, extra)
	}
	if err := admin.CoreV1().Nodes().Delete(ctx, "n1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if code := as(placedTR.Status.Token, 1); code != http.StatusOK {
		t.Errorf("token of a pod whose node is gone: status %d, want 200", code)
	}

	if err := admin.CoreV1().Pods("default").Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	revoked(t, "token bound to a deleted pod", func() int { return as(boundTR.Status.Token, 2) })

	// Deleting the account revokes its tokens, also when it is recreated under the same name.
	if err := admin.CoreV1().ServiceAccounts("default").Delete(ctx, sa.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "robot"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	revoked(t, "token of a deleted and recreated account", func() int { return as(tr.Status.Token, 0) })
}

// revoked waits until a token is refused: the server checks its objects in the watch cache, which follows
// a deletion within moments, as Kubernetes' token authenticator follows its informers.
func revoked(t *testing.T, what string, status func() int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	code := status()
	for code != http.StatusUnauthorized && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		code = status()
	}
	if code != http.StatusUnauthorized {
		t.Errorf("%s: status %d, want 401", what, code)
	}
}
