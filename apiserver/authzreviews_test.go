package apiserver

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"

	"github.com/skiff-dev/skiff/apiserver/auth"
)

// fakeAuthorizer allows alice to get pods in dev and GET /healthz, denies deletes (DecisionDeny), fails on
// secrets (NoOpinion with an error) and has no opinion on anything else. It records the last attributes.
type fakeAuthorizer struct {
	last authorizer.Attributes
}

func (f *fakeAuthorizer) authorizer() authorizer.Authorizer {
	return authorizer.AuthorizerFunc(func(ctx context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
		f.last = a
		switch {
		case a.GetVerb() == "delete":
			return authorizer.DecisionDeny, "deletes are denied", nil
		case a.GetResource() == "secrets":
			return authorizer.DecisionNoOpinion, "", errors.New("webhook unreachable")
		case a.GetUser().GetName() != "alice":
		case a.IsResourceRequest() && a.GetVerb() == "get" && a.GetResource() == "pods" && a.GetNamespace() == "dev" && a.GetAPIGroup() == "":
			return authorizer.DecisionAllow, "alice reads pods in dev", nil
		case !a.IsResourceRequest() && a.GetVerb() == "get" && a.GetPath() == "/healthz":
			return authorizer.DecisionAllow, "", nil
		}
		return authorizer.DecisionNoOpinion, "no policy matched", nil
	})
}

func asUser(name string, groups ...string) context.Context {
	return genericapirequest.WithUser(context.Background(), &user.DefaultInfo{Name: name, Groups: groups})
}

// wantInvalid checks err is a 422 of kind whose causes are exactly the given field paths, each with a
// message containing the given text.
func wantInvalid(t *testing.T, err error, kind string, causes map[string]string) {
	t.Helper()
	if !apierrors.IsInvalid(err) {
		t.Fatalf("error %v, want 422 Invalid", err)
	}
	status := err.(apierrors.APIStatus).Status()
	if status.Code != 422 || status.Details == nil || status.Details.Kind != kind || status.Details.Group != authorizationv1.GroupName {
		t.Fatalf("status %+v, want 422 for %s.%s", status, kind, authorizationv1.GroupName)
	}
	got := map[string]string{}
	for _, c := range status.Details.Causes {
		got[c.Field] = c.Message
	}
	if len(got) != len(causes) {
		t.Fatalf("causes %+v, want fields %v", status.Details.Causes, causes)
	}
	for field, text := range causes {
		if msg, ok := got[field]; !ok || !strings.Contains(msg, text) {
			t.Errorf("cause of %s: %q, want it to contain %q (all: %+v)", field, msg, text, status.Details.Causes)
		}
	}
}

func wantBadRequest(t *testing.T, err error, text string) {
	t.Helper()
	if !apierrors.IsBadRequest(err) || !strings.Contains(err.Error(), text) {
		t.Fatalf("error %v, want 400 containing %q", err, text)
	}
}

func TestSelfSubjectAccessReview(t *testing.T) {
	fake := &fakeAuthorizer{}
	r := &selfSubjectAccessReviewREST{authorizer: fake.authorizer()}
	create := func(ctx context.Context, spec authorizationv1.SelfSubjectAccessReviewSpec) (*authorizationv1.SelfSubjectAccessReview, error) {
		in := &authorizationv1.SelfSubjectAccessReview{Spec: spec}
		out, err := r.Create(ctx, in, rest.ValidateAllObjectFunc, &metav1.CreateOptions{})
		if err != nil {
			return nil, err
		}
		if out == runtime.Object(in) || in.Status != (authorizationv1.SubjectAccessReviewStatus{}) {
			t.Errorf("Create changed or returned its input")
		}
		return out.(*authorizationv1.SelfSubjectAccessReview), nil
	}
	getPods := &authorizationv1.ResourceAttributes{Namespace: "dev", Verb: "get", Resource: "pods"}
	alice := asUser("alice", "devs")

	for _, tc := range []struct {
		name string
		ctx  context.Context
		spec authorizationv1.SelfSubjectAccessReviewSpec
		want authorizationv1.SubjectAccessReviewStatus
	}{
		{"allowed", alice, authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: getPods},
			authorizationv1.SubjectAccessReviewStatus{Allowed: true, Reason: "alice reads pods in dev"}},
		{"another user", asUser("bob"), authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: getPods},
			authorizationv1.SubjectAccessReviewStatus{Reason: "no policy matched"}},
		{"denied", alice, authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: "dev", Verb: "delete", Resource: "pods"}},
			authorizationv1.SubjectAccessReviewStatus{Denied: true, Reason: "deletes are denied"}},
		{"no opinion", alice, authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: "dev", Verb: "list", Resource: "pods"}},
			authorizationv1.SubjectAccessReviewStatus{Reason: "no policy matched"}},
		{"evaluation error", alice, authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: "dev", Verb: "get", Resource: "secrets"}},
			authorizationv1.SubjectAccessReviewStatus{EvaluationError: "webhook unreachable"}},
		{"non-resource allowed", alice, authorizationv1.SelfSubjectAccessReviewSpec{NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/healthz", Verb: "get"}},
			authorizationv1.SubjectAccessReviewStatus{Allowed: true}},
		{"non-resource, another user", asUser("bob"), authorizationv1.SelfSubjectAccessReviewSpec{NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/healthz", Verb: "get"}},
			authorizationv1.SubjectAccessReviewStatus{Reason: "no policy matched"}},
		{"non-resource no opinion", alice, authorizationv1.SelfSubjectAccessReviewSpec{NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/metrics", Verb: "get"}},
			authorizationv1.SubjectAccessReviewStatus{Reason: "no policy matched"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := create(tc.ctx, tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			if out.Status != tc.want {
				t.Errorf("status %+v, want %+v", out.Status, tc.want)
			}
			if !reflect.DeepEqual(out.Spec, tc.spec) {
				t.Errorf("spec not echoed: %+v", out.Spec)
			}
		})
	}

	// The attributes the authorizer sees: the requester, and "*" for an empty version.
	if _, err := create(alice, authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
		Namespace: "dev", Verb: "get", Group: "apps", Resource: "deployments", Subresource: "scale", Name: "web"}}); err != nil {
		t.Fatal(err)
	}
	a := fake.last
	if a.GetUser().GetName() != "alice" || !slices.Equal(a.GetUser().GetGroups(), []string{"devs"}) || !a.IsResourceRequest() ||
		a.GetAPIGroup() != "apps" || a.GetAPIVersion() != "*" || a.GetResource() != "deployments" || a.GetSubresource() != "scale" ||
		a.GetName() != "web" || a.GetNamespace() != "dev" || a.GetVerb() != "get" {
		t.Errorf("attributes %+v", a)
	}
	if _, err := create(alice, authorizationv1.SelfSubjectAccessReviewSpec{NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/version", Verb: "get"}}); err != nil {
		t.Fatal(err)
	}
	if a := fake.last; a.IsResourceRequest() || a.GetPath() != "/version" || a.GetVerb() != "get" || a.GetUser().GetName() != "alice" {
		t.Errorf("non-resource attributes %+v", a)
	}

	// Selectors: requirements reach the authorizer; an unparsable one is ignored and said so.
	out, err := create(alice, authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
		Namespace: "dev", Verb: "list", Resource: "pods",
		FieldSelector: &authorizationv1.FieldSelectorAttributes{Requirements: []metav1.FieldSelectorRequirement{{Key: "spec.nodeName", Operator: metav1.FieldSelectorOpIn, Values: []string{"n1"}}}},
		LabelSelector: &authorizationv1.LabelSelectorAttributes{RawSelector: "app in (web"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	fields, fieldErr := fake.last.GetFieldSelector()
	if fieldErr != nil || len(fields) != 1 || fields[0].Field != "spec.nodeName" || fields[0].Operator != selection.Equals || fields[0].Value != "n1" {
		t.Errorf("field selector %+v, %v", fields, fieldErr)
	}
	if labels, labelErr := fake.last.GetLabelSelector(); labelErr == nil || len(labels) != 0 {
		t.Errorf("label selector %+v, %v: want a parse error", labels, labelErr)
	}
	if out.Status.EvaluationError != "spec.resourceAttributes.labelSelector ignored due to parse error" {
		t.Errorf("evaluationError %q", out.Status.EvaluationError)
	}

	// Invalid reviews: 422 with kube's field paths and messages.
	const exactlyOne = "exactly one of nonResourceAttributes or resourceAttributes must be specified"
	_, err = create(alice, authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: getPods, NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/healthz", Verb: "get"}})
	wantInvalid(t, err, "SelfSubjectAccessReview", map[string]string{"spec": exactlyOne})
	_, err = create(alice, authorizationv1.SelfSubjectAccessReviewSpec{})
	wantInvalid(t, err, "SelfSubjectAccessReview", map[string]string{"spec": exactlyOne})
	_, err = create(alice, authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "list", Resource: "pods",
		LabelSelector: &authorizationv1.LabelSelectorAttributes{}}})
	wantInvalid(t, err, "SelfSubjectAccessReview", map[string]string{"spec.resourceAttributes.labelSelector.requirements": "requirements or rawSelector is required"})
	_, err = r.Create(alice, &authorizationv1.SelfSubjectAccessReview{ObjectMeta: metav1.ObjectMeta{Name: "x"}, Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: getPods}}, nil, nil)
	wantInvalid(t, err, "SelfSubjectAccessReview", map[string]string{"metadata": "must be empty"})
	// managedFields, which the request handler sets, are no metadata of the review's.
	if _, err := r.Create(alice, &authorizationv1.SelfSubjectAccessReview{ObjectMeta: metav1.ObjectMeta{ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}},
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: getPods}}, nil, nil); err != nil {
		t.Errorf("review with managedFields: %v", err)
	}

	// No user, a failing admission, another type.
	_, err = create(context.Background(), authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: getPods})
	wantBadRequest(t, err, "no user present on request")
	refuse := func(context.Context, runtime.Object) error {
		return apierrors.NewForbidden(schema.GroupResource{}, "", errors.New("no"))
	}
	if _, err := r.Create(alice, &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: getPods}}, refuse, nil); !apierrors.IsForbidden(err) {
		t.Errorf("create validation refusing: %v", err)
	}
	_, err = r.Create(alice, &authorizationv1.SubjectAccessReview{}, nil, nil)
	wantBadRequest(t, err, "not a SelfSubjectAccessReview")
}

func TestSubjectAccessReview(t *testing.T) {
	fake := &fakeAuthorizer{}
	r := &subjectAccessReviewREST{authorizer: fake.authorizer()}
	// The requester does not matter: the review is about spec's user.
	ctx := asUser("admin", user.SystemPrivilegedGroup)
	create := func(spec authorizationv1.SubjectAccessReviewSpec) (*authorizationv1.SubjectAccessReview, error) {
		out, err := r.Create(ctx, &authorizationv1.SubjectAccessReview{Spec: spec}, rest.ValidateAllObjectFunc, &metav1.CreateOptions{})
		if err != nil {
			return nil, err
		}
		return out.(*authorizationv1.SubjectAccessReview), nil
	}
	getPods := &authorizationv1.ResourceAttributes{Namespace: "dev", Verb: "get", Resource: "pods"}

	out, err := create(authorizationv1.SubjectAccessReviewSpec{ResourceAttributes: getPods, User: "alice", UID: "u-1", Groups: []string{"devs"},
		Extra: map[string]authorizationv1.ExtraValue{"scopes": {"a", "b"}}})
	if err != nil {
		t.Fatal(err)
	}
	if want := (authorizationv1.SubjectAccessReviewStatus{Allowed: true, Reason: "alice reads pods in dev"}); out.Status != want {
		t.Errorf("status %+v, want %+v", out.Status, want)
	}
	u := fake.last.GetUser()
	if u.GetName() != "alice" || u.GetUID() != "u-1" || !slices.Equal(u.GetGroups(), []string{"devs"}) || !reflect.DeepEqual(u.GetExtra(), map[string][]string{"scopes": {"a", "b"}}) {
		t.Errorf("user %+v", u)
	}
	for _, tc := range []struct {
		spec authorizationv1.SubjectAccessReviewSpec
		want authorizationv1.SubjectAccessReviewStatus
	}{
		{authorizationv1.SubjectAccessReviewSpec{ResourceAttributes: getPods, User: "bob"}, authorizationv1.SubjectAccessReviewStatus{Reason: "no policy matched"}},
		{authorizationv1.SubjectAccessReviewSpec{ResourceAttributes: getPods, Groups: []string{"devs"}}, authorizationv1.SubjectAccessReviewStatus{Reason: "no policy matched"}},
		{authorizationv1.SubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "delete", Resource: "nodes"}, User: "alice"},
			authorizationv1.SubjectAccessReviewStatus{Denied: true, Reason: "deletes are denied"}},
		{authorizationv1.SubjectAccessReviewSpec{NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/healthz", Verb: "get"}, User: "alice"},
			authorizationv1.SubjectAccessReviewStatus{Allowed: true}},
	} {
		out, err := create(tc.spec)
		if err != nil {
			t.Fatal(err)
		}
		if out.Status != tc.want {
			t.Errorf("%+v: status %+v, want %+v", tc.spec, out.Status, tc.want)
		}
	}

	const exactlyOne = "exactly one of nonResourceAttributes or resourceAttributes must be specified"
	_, err = create(authorizationv1.SubjectAccessReviewSpec{User: "alice"})
	wantInvalid(t, err, "SubjectAccessReview", map[string]string{"spec": exactlyOne})
	_, err = create(authorizationv1.SubjectAccessReviewSpec{User: "alice", ResourceAttributes: getPods, NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/", Verb: "get"}})
	wantInvalid(t, err, "SubjectAccessReview", map[string]string{"spec": exactlyOne})
	_, err = create(authorizationv1.SubjectAccessReviewSpec{ResourceAttributes: getPods})
	wantInvalid(t, err, "SubjectAccessReview", map[string]string{"spec.user": "at least one of user or group must be specified"})
	_, err = create(authorizationv1.SubjectAccessReviewSpec{User: "alice", ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "list", Resource: "pods",
		FieldSelector: &authorizationv1.FieldSelectorAttributes{RawSelector: "a=b", Requirements: []metav1.FieldSelectorRequirement{{Key: "a", Operator: metav1.FieldSelectorOpIn, Values: []string{"b"}}}}}})
	wantInvalid(t, err, "SubjectAccessReview", map[string]string{"spec.resourceAttributes.fieldSelector.rawSelector": "may not specified at the same time as requirements"})
}

func TestLocalSubjectAccessReview(t *testing.T) {
	fake := &fakeAuthorizer{}
	r := &localSubjectAccessReviewREST{authorizer: fake.authorizer()}
	if !r.NamespaceScoped() {
		t.Fatal("LocalSubjectAccessReviews are namespaced")
	}
	inNamespace := func(ns string) context.Context {
		return genericapirequest.WithNamespace(asUser("admin"), ns)
	}
	// review is what the request handler passes on: metadata.namespace set to the request's.
	review := func(ns string, spec authorizationv1.SubjectAccessReviewSpec) *authorizationv1.LocalSubjectAccessReview {
		return &authorizationv1.LocalSubjectAccessReview{ObjectMeta: metav1.ObjectMeta{Namespace: ns}, Spec: spec}
	}
	getPodsIn := func(ns string) *authorizationv1.ResourceAttributes {
		return &authorizationv1.ResourceAttributes{Namespace: ns, Verb: "get", Resource: "pods"}
	}

	out, err := r.Create(inNamespace("dev"), review("dev", authorizationv1.SubjectAccessReviewSpec{User: "alice", ResourceAttributes: getPodsIn("dev")}), rest.ValidateAllObjectFunc, nil)
	if err != nil {
		t.Fatal(err)
	}
	lsar := out.(*authorizationv1.LocalSubjectAccessReview)
	if want := (authorizationv1.SubjectAccessReviewStatus{Allowed: true, Reason: "alice reads pods in dev"}); lsar.Status != want || lsar.Namespace != "dev" {
		t.Errorf("review %+v, want status %+v in dev", lsar, want)
	}
	out, err = r.Create(inNamespace("prod"), review("prod", authorizationv1.SubjectAccessReviewSpec{User: "alice", ResourceAttributes: getPodsIn("prod")}), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st := out.(*authorizationv1.LocalSubjectAccessReview).Status; st.Allowed || st.Denied {
		t.Errorf("alice in prod: %+v", st)
	}
	if fake.last.GetNamespace() != "prod" || fake.last.GetUser().GetName() != "alice" {
		t.Errorf("attributes %+v", fake.last)
	}

	// spec.resourceAttributes.namespace is not the review's namespace: 422.
	_, err = r.Create(inNamespace("dev"), review("dev", authorizationv1.SubjectAccessReviewSpec{User: "alice", ResourceAttributes: getPodsIn("prod")}), nil, nil)
	wantInvalid(t, err, "LocalSubjectAccessReview", map[string]string{"spec.resourceAttributes.namespace": "must match metadata.namespace"})
	if !strings.Contains(err.Error(), `spec.resourceAttributes.namespace: Invalid value: "prod": must match metadata.namespace`) {
		t.Errorf("message %q", err)
	}
	_, err = r.Create(inNamespace("dev"), review("dev", authorizationv1.SubjectAccessReviewSpec{User: "alice", ResourceAttributes: getPodsIn("")}), nil, nil)
	wantInvalid(t, err, "LocalSubjectAccessReview", map[string]string{"spec.resourceAttributes.namespace": "must match metadata.namespace"})
	_, err = r.Create(inNamespace("dev"), review("dev", authorizationv1.SubjectAccessReviewSpec{User: "alice", NonResourceAttributes: &authorizationv1.NonResourceAttributes{Path: "/healthz", Verb: "get"}}), nil, nil)
	wantInvalid(t, err, "LocalSubjectAccessReview", map[string]string{"spec.nonResourceAttributes": "disallowed on this kind of request"})
	_, err = r.Create(inNamespace("dev"), review("dev", authorizationv1.SubjectAccessReviewSpec{User: "alice"}), nil, nil)
	wantInvalid(t, err, "LocalSubjectAccessReview", map[string]string{"spec": "exactly one of nonResourceAttributes or resourceAttributes must be specified"})
	bad := review("dev", authorizationv1.SubjectAccessReviewSpec{User: "alice", ResourceAttributes: getPodsIn("dev")})
	bad.Labels = map[string]string{"a": "b"}
	_, err = r.Create(inNamespace("dev"), bad, nil, nil)
	wantInvalid(t, err, "LocalSubjectAccessReview", map[string]string{"metadata": "must be empty except for namespace"})

	// The review's namespace is not the request's: 400, as kube.
	_, err = r.Create(inNamespace("prod"), review("dev", authorizationv1.SubjectAccessReviewSpec{User: "alice", ResourceAttributes: getPodsIn("dev")}), nil, nil)
	wantBadRequest(t, err, "spec.resourceAttributes.namespace must match namespace: prod")
	_, err = r.Create(asUser("admin"), review("", authorizationv1.SubjectAccessReviewSpec{User: "alice", ResourceAttributes: getPodsIn("")}), nil, nil)
	wantBadRequest(t, err, "namespace is required on this type")
}

// fakeRules resolves fixed rules and records whom and where it was asked about.
type fakeRules struct {
	resource    []authorizer.ResourceRuleInfo
	nonResource []authorizer.NonResourceRuleInfo
	incomplete  bool
	err         error
	user        user.Info
	namespace   string
}

func (f *fakeRules) RulesFor(_ context.Context, u user.Info, namespace string) ([]authorizer.ResourceRuleInfo, []authorizer.NonResourceRuleInfo, bool, error) {
	f.user, f.namespace = u, namespace
	return f.resource, f.nonResource, f.incomplete, f.err
}

func TestSelfSubjectRulesReview(t *testing.T) {
	rules := &fakeRules{
		resource: []authorizer.ResourceRuleInfo{
			&authorizer.DefaultResourceRuleInfo{Verbs: []string{"get", "list"}, APIGroups: []string{""}, Resources: []string{"pods"}},
			&authorizer.DefaultResourceRuleInfo{Verbs: []string{"get"}, APIGroups: []string{"apps"}, Resources: []string{"deployments"}, ResourceNames: []string{"web"}},
		},
		nonResource: []authorizer.NonResourceRuleInfo{&authorizer.DefaultNonResourceRuleInfo{Verbs: []string{"get"}, NonResourceURLs: []string{"/healthz", "/version"}}},
		incomplete:  true,
		err:         errors.New("webhook authorizer cannot list rules"),
	}
	r := &selfSubjectRulesReviewREST{rules: rules}
	out, err := r.Create(asUser("alice", "devs"), &authorizationv1.SelfSubjectRulesReview{Spec: authorizationv1.SelfSubjectRulesReviewSpec{Namespace: "dev"}}, rest.ValidateAllObjectFunc, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := authorizationv1.SubjectRulesReviewStatus{
		ResourceRules: []authorizationv1.ResourceRule{
			{Verbs: []string{"get", "list"}, APIGroups: []string{""}, Resources: []string{"pods"}},
			{Verbs: []string{"get"}, APIGroups: []string{"apps"}, Resources: []string{"deployments"}, ResourceNames: []string{"web"}},
		},
		NonResourceRules: []authorizationv1.NonResourceRule{{Verbs: []string{"get"}, NonResourceURLs: []string{"/healthz", "/version"}}},
		Incomplete:       true,
		EvaluationError:  "webhook authorizer cannot list rules",
	}
	review := out.(*authorizationv1.SelfSubjectRulesReview)
	if !reflect.DeepEqual(review.Status, want) {
		t.Errorf("status %+v, want %+v", review.Status, want)
	}
	if review.Spec.Namespace != "" {
		t.Errorf("spec %+v: kube answers with the status alone", review.Spec)
	}
	if rules.user.GetName() != "alice" || rules.namespace != "dev" {
		t.Errorf("rules asked for %v in %q", rules.user, rules.namespace)
	}

	// No rules: empty lists, not null, as kubectl auth can-i --list reads them.
	r = &selfSubjectRulesReviewREST{rules: &fakeRules{}}
	out, err = r.Create(asUser("bob"), &authorizationv1.SelfSubjectRulesReview{Spec: authorizationv1.SelfSubjectRulesReviewSpec{Namespace: "default"}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := json.Marshal(out.(*authorizationv1.SelfSubjectRulesReview).Status)
	if err != nil {
		t.Fatal(err)
	}
	if string(body) != `{"resourceRules":[],"nonResourceRules":[],"incomplete":false}` {
		t.Errorf("empty status %s", body)
	}

	_, err = r.Create(asUser("bob"), &authorizationv1.SelfSubjectRulesReview{}, nil, nil)
	wantBadRequest(t, err, "no namespace on request")
	_, err = r.Create(context.Background(), &authorizationv1.SelfSubjectRulesReview{Spec: authorizationv1.SelfSubjectRulesReviewSpec{Namespace: "default"}}, nil, nil)
	wantBadRequest(t, err, "no user present on request")
}

// fakeTokens knows the admin token (audience-agnostic, as Skiff's admin and node tokens are) and a service
// account token (for the service account issuer only, as Skiff's are), and fails on "broken".
type fakeTokens struct {
	audiences authenticator.Audiences
	asked     bool
}

func (f *fakeTokens) AuthenticateToken(ctx context.Context, token string) (*authenticator.Response, bool, error) {
	f.audiences, f.asked = authenticator.AudiencesFrom(ctx)
	switch token {
	case "admin-token":
		return &authenticator.Response{User: &user.DefaultInfo{Name: "admin", Groups: []string{user.SystemPrivilegedGroup, user.AllAuthenticated}}}, true, nil
	case "sa-token":
		return &authenticator.Response{
			User: &user.DefaultInfo{Name: "system:serviceaccount:dev:robot", UID: "sa-uid", Groups: []string{"system:serviceaccounts", "system:serviceaccounts:dev"},
				Extra: map[string][]string{"authentication.kubernetes.io/pod-name": {"web-1"}}},
			Audiences: authenticator.Audiences{auth.ServiceAccountIssuer},
		}, true, nil
	case "broken":
		return nil, false, errors.New("service account token has been invalidated")
	}
	return nil, false, nil
}

func TestTokenReview(t *testing.T) {
	tokens := &fakeTokens{}
	r := &tokenReviewREST{tokens: tokens}
	ctx := asUser("webhook")
	review := func(token string, audiences ...string) (*authenticationv1.TokenReview, error) {
		out, err := r.Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token, Audiences: audiences}}, rest.ValidateAllObjectFunc, nil)
		if err != nil {
			return nil, err
		}
		return out.(*authenticationv1.TokenReview), nil
	}

	for _, tc := range []struct {
		name, token string
		audiences   []string
		want        authenticationv1.TokenReviewStatus
	}{
		{"admin token", "admin-token", nil, authenticationv1.TokenReviewStatus{Authenticated: true, Audiences: []string{auth.ServiceAccountIssuer},
			User: authenticationv1.UserInfo{Username: "admin", Groups: []string{user.SystemPrivilegedGroup, user.AllAuthenticated}, Extra: map[string]authenticationv1.ExtraValue{}}}},
		{"service account token", "sa-token", nil, authenticationv1.TokenReviewStatus{Authenticated: true, Audiences: []string{auth.ServiceAccountIssuer},
			User: authenticationv1.UserInfo{Username: "system:serviceaccount:dev:robot", UID: "sa-uid", Groups: []string{"system:serviceaccounts", "system:serviceaccounts:dev"},
				Extra: map[string]authenticationv1.ExtraValue{"authentication.kubernetes.io/pod-name": {"web-1"}}}}},
		{"service account token for the API and another audience", "sa-token", []string{"vault", auth.ServiceAccountIssuer},
			authenticationv1.TokenReviewStatus{Authenticated: true, Audiences: []string{auth.ServiceAccountIssuer},
				User: authenticationv1.UserInfo{Username: "system:serviceaccount:dev:robot", UID: "sa-uid", Groups: []string{"system:serviceaccounts", "system:serviceaccounts:dev"},
					Extra: map[string]authenticationv1.ExtraValue{"authentication.kubernetes.io/pod-name": {"web-1"}}}}},
		{"unknown token", "nonsense", nil, authenticationv1.TokenReviewStatus{Error: "invalid bearer token"}},
		{"authenticator error", "broken", nil, authenticationv1.TokenReviewStatus{Error: "service account token has been invalidated"}},
		{"admin token for another audience", "admin-token", []string{"vault"}, authenticationv1.TokenReviewStatus{Error: "invalid bearer token"}},
		{"service account token for another audience", "sa-token", []string{"vault"}, authenticationv1.TokenReviewStatus{
			Error: `token audiences ["` + auth.ServiceAccountIssuer + `"] is invalid for the target audiences ["vault"]`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := review(tc.token, tc.audiences...)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(out.Status, tc.want) {
				t.Errorf("status %+v, want %+v", out.Status, tc.want)
			}
			if out.Spec.Token != tc.token || !slices.Equal(out.Spec.Audiences, tc.audiences) {
				t.Errorf("spec %+v", out.Spec)
			}
			wantAuds := tc.audiences
			if len(wantAuds) == 0 {
				wantAuds = []string{auth.ServiceAccountIssuer}
			}
			if !tokens.asked || !slices.Equal(tokens.audiences, wantAuds) {
				t.Errorf("authenticator asked for audiences %v (%v), want %v", tokens.audiences, tokens.asked, wantAuds)
			}
		})
	}

	_, err := review("")
	wantBadRequest(t, err, "token is required for TokenReview in authentication")
	_, err = r.Create(genericapirequest.WithNamespace(ctx, "dev"), &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: "admin-token"}}, nil, nil)
	wantBadRequest(t, err, "namespace is not allowed on this type: dev")
	_, err = r.Create(ctx, &authenticationv1.SelfSubjectReview{}, nil, nil)
	wantBadRequest(t, err, "not a TokenReview")
}

// TestAuthorizationReviewGroup: the group serves the four reviews, whose types the scheme knows (as v1 and
// as their own internal version), and decodes a review as kubectl sends it.
func TestAuthorizationReviewGroup(t *testing.T) {
	info := authorizationAPIGroup((&fakeAuthorizer{}).authorizer(), &fakeRules{})
	storage := info.VersionedResourcesStorageMap["v1"]
	want := map[string]bool{"selfsubjectaccessreviews": false, "subjectaccessreviews": false, "localsubjectaccessreviews": true, "selfsubjectrulesreviews": false}
	if len(storage) != len(want) {
		t.Errorf("resources %v, want %v", slices.Sorted(maps.Keys(storage)), want)
	}
	for resource, namespaced := range want {
		st, ok := storage[resource].(interface {
			rest.Creater
			rest.Scoper
		})
		if !ok {
			t.Errorf("%s: %T is not a namespace-aware Creater", resource, storage[resource])
			continue
		}
		if st.NamespaceScoped() != namespaced {
			t.Errorf("%s: namespaced %v", resource, st.NamespaceScoped())
		}
		gvks, _, err := Scheme.ObjectKinds(st.New())
		if err != nil || !slices.Contains(gvks, authorizationv1.SchemeGroupVersion.WithKind(reflect.TypeOf(st.New()).Elem().Name())) {
			t.Errorf("%s: scheme kinds %v, %v", resource, gvks, err)
		}
	}
	if info.PrioritizedVersions[0] != authorizationv1.SchemeGroupVersion {
		t.Errorf("versions %v", info.PrioritizedVersions)
	}

	body := `{"kind":"SelfSubjectAccessReview","apiVersion":"authorization.k8s.io/v1","metadata":{"creationTimestamp":null},` +
		`"spec":{"resourceAttributes":{"namespace":"dev","verb":"get","resource":"pods"}},"status":{"allowed":false}}`
	decoder := Codecs.UniversalDecoder(schema.GroupVersion{Group: authorizationv1.GroupName, Version: runtime.APIVersionInternal})
	obj, err := runtime.Decode(decoder, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	out, err := storage["selfsubjectaccessreviews"].(rest.Creater).Create(asUser("alice"), obj, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !out.(*authorizationv1.SelfSubjectAccessReview).Status.Allowed {
		t.Errorf("decoded review not allowed: %+v", out)
	}
	if _, err := runtime.Encode(Codecs.LegacyCodec(authorizationv1.SchemeGroupVersion), out); err != nil {
		t.Errorf("encoding the answer: %v", err)
	}

	if _, ok := authorizationAPIGroup((&fakeAuthorizer{}).authorizer(), nil).VersionedResourcesStorageMap["v1"]["selfsubjectrulesreviews"]; ok {
		t.Error("rules reviews served without a rule resolver")
	}
}
