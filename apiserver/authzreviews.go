package apiserver

import (
	"context"
	"errors"
	"fmt"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
	genericapiserver "k8s.io/apiserver/pkg/server"
	authorizationapi "k8s.io/kubernetes/pkg/apis/authorization"
	authorizationapiv1 "k8s.io/kubernetes/pkg/apis/authorization/v1"
	authorizationvalidation "k8s.io/kubernetes/pkg/apis/authorization/validation"
	authorizationutil "k8s.io/kubernetes/pkg/registry/authorization/util"

	"github.com/skiff-dev/skiff/apiserver/auth"
)

// The authorization.k8s.io/v1 reviews (`kubectl auth can-i`) and the authentication.k8s.io/v1 TokenReview
// answer as kube-apiserver's pkg/registry/authorization/* and pkg/registry/authentication/tokenreview do.
// Nothing is stored. Skiff serves the v1 types as their own internal version, so each access review is
// converted to kube's internal type with kube's generated conversion, validated by kube's handwritten
// validation and turned into authorizer attributes by kube's registry helpers; the answer is written on
// the v1 object.

// authorizationAPIGroup serves the four authorization.k8s.io/v1 reviews: a's decisions for the access
// reviews, rules' answers for SelfSubjectRulesReviews (not served when rules is nil).
func authorizationAPIGroup(a authorizer.Authorizer, rules authorizer.RuleResolver) genericapiserver.APIGroupInfo {
	info := genericapiserver.NewDefaultAPIGroupInfo(authorizationv1.GroupName, Scheme, ParameterCodec, Codecs)
	storage := map[string]rest.Storage{
		"selfsubjectaccessreviews":  &selfSubjectAccessReviewREST{authorizer: a},
		"subjectaccessreviews":      &subjectAccessReviewREST{authorizer: a},
		"localsubjectaccessreviews": &localSubjectAccessReviewREST{authorizer: a},
	}
	if rules != nil {
		storage["selfsubjectrulesreviews"] = &selfSubjectRulesReviewREST{rules: rules}
	}
	info.VersionedResourcesStorageMap["v1"] = storage
	return info
}

// accessReviewStatus is kube's answer: allowed for an Allow, denied only for a Deny (a NoOpinion is neither),
// the authorizer's reason, and its error together with any ignored field or label selector.
func accessReviewStatus(ctx context.Context, a authorizer.UnconditionalAuthorizer, attrs authorizer.AttributesRecord) authorizationv1.SubjectAccessReviewStatus {
	decision, reason, err := a.Authorize(ctx, attrs)
	return authorizationv1.SubjectAccessReviewStatus{
		Allowed:         decision == authorizer.DecisionAllow,
		Denied:          decision == authorizer.DecisionDeny,
		Reason:          reason,
		EvaluationError: authorizationutil.BuildEvaluationError(err, attrs),
	}
}

// selfSubjectAccessReviewREST answers whether the requesting user may do what the review asks.
type selfSubjectAccessReviewREST struct {
	authorizer authorizer.UnconditionalAuthorizer
}

var (
	_ rest.Creater              = &selfSubjectAccessReviewREST{}
	_ rest.SingularNameProvider = &selfSubjectAccessReviewREST{}
)

func (r *selfSubjectAccessReviewREST) New() runtime.Object {
	return &authorizationv1.SelfSubjectAccessReview{}
}
func (r *selfSubjectAccessReviewREST) Destroy()                {}
func (r *selfSubjectAccessReviewREST) NamespaceScoped() bool   { return false }
func (r *selfSubjectAccessReviewREST) GetSingularName() string { return "selfsubjectaccessreview" }

func (r *selfSubjectAccessReviewREST) Create(ctx context.Context, obj runtime.Object, createValidation rest.ValidateObjectFunc, options *metav1.CreateOptions) (runtime.Object, error) {
	in, ok := obj.(*authorizationv1.SelfSubjectAccessReview)
	if !ok {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("not a SelfSubjectAccessReview: %#v", obj))
	}
	review := in.DeepCopy()
	var internal authorizationapi.SelfSubjectAccessReview
	if err := authorizationapiv1.Convert_v1_SelfSubjectAccessReview_To_authorization_SelfSubjectAccessReview(review, &internal, nil); err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	if errs := authorizationvalidation.ValidateSelfSubjectAccessReview(&internal); len(errs) > 0 {
		return nil, apierrors.NewInvalid(authorizationapi.Kind("SelfSubjectAccessReview"), "", errs)
	}
	userToCheck, ok := genericapirequest.UserFrom(ctx)
	if !ok {
		return nil, apierrors.NewBadRequest("no user present on request")
	}
	if createValidation != nil {
		if err := createValidation(ctx, obj.DeepCopyObject()); err != nil {
			return nil, err
		}
	}
	var attrs authorizer.AttributesRecord
	if internal.Spec.ResourceAttributes != nil {
		attrs = authorizationutil.ResourceAttributesFrom(userToCheck, *internal.Spec.ResourceAttributes)
	} else {
		attrs = authorizationutil.NonResourceAttributesFrom(userToCheck, *internal.Spec.NonResourceAttributes)
	}
	review.Status = accessReviewStatus(ctx, r.authorizer, attrs)
	return review, nil
}

// subjectAccessReviewREST answers whether spec's user (user, groups, uid, extra) may do what it asks.
type subjectAccessReviewREST struct {
	authorizer authorizer.UnconditionalAuthorizer
}

var (
	_ rest.Creater              = &subjectAccessReviewREST{}
	_ rest.SingularNameProvider = &subjectAccessReviewREST{}
)

func (r *subjectAccessReviewREST) New() runtime.Object     { return &authorizationv1.SubjectAccessReview{} }
func (r *subjectAccessReviewREST) Destroy()                {}
func (r *subjectAccessReviewREST) NamespaceScoped() bool   { return false }
func (r *subjectAccessReviewREST) GetSingularName() string { return "subjectaccessreview" }

func (r *subjectAccessReviewREST) Create(ctx context.Context, obj runtime.Object, createValidation rest.ValidateObjectFunc, options *metav1.CreateOptions) (runtime.Object, error) {
	in, ok := obj.(*authorizationv1.SubjectAccessReview)
	if !ok {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("not a SubjectAccessReview: %#v", obj))
	}
	review := in.DeepCopy()
	var internal authorizationapi.SubjectAccessReview
	if err := authorizationapiv1.Convert_v1_SubjectAccessReview_To_authorization_SubjectAccessReview(review, &internal, nil); err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	if errs := authorizationvalidation.ValidateSubjectAccessReview(&internal); len(errs) > 0 {
		return nil, apierrors.NewInvalid(authorizationapi.Kind("SubjectAccessReview"), "", errs)
	}
	if createValidation != nil {
		if err := createValidation(ctx, obj.DeepCopyObject()); err != nil {
			return nil, err
		}
	}
	review.Status = accessReviewStatus(ctx, r.authorizer, authorizationutil.AuthorizationAttributesFrom(internal.Spec))
	return review, nil
}

// localSubjectAccessReviewREST is a SubjectAccessReview confined to the request's namespace.
type localSubjectAccessReviewREST struct {
	authorizer authorizer.UnconditionalAuthorizer
}

var (
	_ rest.Creater              = &localSubjectAccessReviewREST{}
	_ rest.SingularNameProvider = &localSubjectAccessReviewREST{}
)

func (r *localSubjectAccessReviewREST) New() runtime.Object {
	return &authorizationv1.LocalSubjectAccessReview{}
}
func (r *localSubjectAccessReviewREST) Destroy()                {}
func (r *localSubjectAccessReviewREST) NamespaceScoped() bool   { return true }
func (r *localSubjectAccessReviewREST) GetSingularName() string { return "localsubjectaccessreview" }

// Create checks, as kube does, that spec.resourceAttributes.namespace is the object's namespace (422: the
// request handler has already set an empty metadata.namespace to the request's, and refused a different one),
// and that the object's namespace is the request's (400).
func (r *localSubjectAccessReviewREST) Create(ctx context.Context, obj runtime.Object, createValidation rest.ValidateObjectFunc, options *metav1.CreateOptions) (runtime.Object, error) {
	in, ok := obj.(*authorizationv1.LocalSubjectAccessReview)
	if !ok {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("not a LocaLocalSubjectAccessReview: %#v", obj))
	}
	review := in.DeepCopy()
	var internal authorizationapi.LocalSubjectAccessReview
	if err := authorizationapiv1.Convert_v1_LocalSubjectAccessReview_To_authorization_LocalSubjectAccessReview(review, &internal, nil); err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	if errs := authorizationvalidation.ValidateLocalSubjectAccessReview(&internal); len(errs) > 0 {
		return nil, apierrors.NewInvalid(authorizationapi.Kind("LocalSubjectAccessReview"), "", errs)
	}
	namespace := genericapirequest.NamespaceValue(ctx)
	if len(namespace) == 0 {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("namespace is required on this type: %v", namespace))
	}
	if namespace != internal.Namespace {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("spec.resourceAttributes.namespace must match namespace: %v", namespace))
	}
	if createValidation != nil {
		if err := createValidation(ctx, obj.DeepCopyObject()); err != nil {
			return nil, err
		}
	}
	review.Status = accessReviewStatus(ctx, r.authorizer, authorizationutil.AuthorizationAttributesFrom(internal.Spec))
	return review, nil
}

// selfSubjectRulesReviewREST lists what the requesting user may do in spec.namespace
// (`kubectl auth can-i --list`).
type selfSubjectRulesReviewREST struct {
	rules authorizer.RuleResolver
}

var (
	_ rest.Creater              = &selfSubjectRulesReviewREST{}
	_ rest.SingularNameProvider = &selfSubjectRulesReviewREST{}
)

func (r *selfSubjectRulesReviewREST) New() runtime.Object {
	return &authorizationv1.SelfSubjectRulesReview{}
}
func (r *selfSubjectRulesReviewREST) Destroy()                {}
func (r *selfSubjectRulesReviewREST) NamespaceScoped() bool   { return false }
func (r *selfSubjectRulesReviewREST) GetSingularName() string { return "selfsubjectrulesreview" }

// Create answers, as kube does, with a new object holding only the status: the rules (never null), whether
// they are incomplete, and the resolver's error.
func (r *selfSubjectRulesReviewREST) Create(ctx context.Context, obj runtime.Object, createValidation rest.ValidateObjectFunc, options *metav1.CreateOptions) (runtime.Object, error) {
	review, ok := obj.(*authorizationv1.SelfSubjectRulesReview)
	if !ok {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("not a SelfSubjectRulesReview: %#v", obj))
	}
	u, ok := genericapirequest.UserFrom(ctx)
	if !ok {
		return nil, apierrors.NewBadRequest("no user present on request")
	}
	namespace := review.Spec.Namespace
	if namespace == "" {
		return nil, apierrors.NewBadRequest("no namespace on request")
	}
	if createValidation != nil {
		if err := createValidation(ctx, obj.DeepCopyObject()); err != nil {
			return nil, err
		}
	}
	resourceInfo, nonResourceInfo, incomplete, err := r.rules.RulesFor(ctx, u, namespace)
	ret := &authorizationv1.SelfSubjectRulesReview{
		Status: authorizationv1.SubjectRulesReviewStatus{
			ResourceRules:    make([]authorizationv1.ResourceRule, len(resourceInfo)),
			NonResourceRules: make([]authorizationv1.NonResourceRule, len(nonResourceInfo)),
			Incomplete:       incomplete,
		},
	}
	for i, info := range resourceInfo {
		ret.Status.ResourceRules[i] = authorizationv1.ResourceRule{
			Verbs: info.GetVerbs(), APIGroups: info.GetAPIGroups(), Resources: info.GetResources(), ResourceNames: info.GetResourceNames(),
		}
	}
	for i, info := range nonResourceInfo {
		ret.Status.NonResourceRules[i] = authorizationv1.NonResourceRule{Verbs: info.GetVerbs(), NonResourceURLs: info.GetNonResourceURLs()}
	}
	if err != nil {
		ret.Status.EvaluationError = err.Error()
	}
	return ret, nil
}

// tokenReviewREST answers authentication.k8s.io/v1 TokenReviews with the token authenticator, as
// kube-apiserver's tokenreview storage does with its request authenticator.
type tokenReviewREST struct {
	tokens authenticator.Token
}

var (
	_ rest.Creater              = &tokenReviewREST{}
	_ rest.SingularNameProvider = &tokenReviewREST{}
)

// apiAudiences are the audiences a TokenReview without spec.audiences asks for, and those the tokens of an
// audience-agnostic authenticator (the admin token, node join tokens) are good for: kube-apiserver's
// --api-audiences, which defaults to its service account issuer.
var apiAudiences = authenticator.Audiences{auth.ServiceAccountIssuer}

// errInvalidBearerToken is what kube's bearer token authenticator says of a token no authenticator accepts.
const errInvalidBearerToken = "invalid bearer token"

func (r *tokenReviewREST) New() runtime.Object     { return &authenticationv1.TokenReview{} }
func (r *tokenReviewREST) Destroy()                {}
func (r *tokenReviewREST) NamespaceScoped() bool   { return false }
func (r *tokenReviewREST) GetSingularName() string { return "tokenreview" }

// Create authenticates spec.token for spec.audiences (the API's audiences when empty), as kube-apiserver
// does: a user of an audience-agnostic authenticator is good for the API's audiences only (kube wraps such
// authenticators with authenticator.WrapAudienceAgnosticToken), and a token for none of the audiences asked
// is refused with the error of kube's service account token authenticator. A token that is not accepted is
// answered unauthenticated, with the reason in status.error.
func (r *tokenReviewREST) Create(ctx context.Context, obj runtime.Object, createValidation rest.ValidateObjectFunc, options *metav1.CreateOptions) (runtime.Object, error) {
	in, ok := obj.(*authenticationv1.TokenReview)
	if !ok {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("not a TokenReview: %#v", obj))
	}
	if namespace := genericapirequest.NamespaceValue(ctx); len(namespace) != 0 {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("namespace is not allowed on this type: %v", namespace))
	}
	if len(in.Spec.Token) == 0 {
		return nil, apierrors.NewBadRequest("token is required for TokenReview in authentication")
	}
	if createValidation != nil {
		if err := createValidation(ctx, obj.DeepCopyObject()); err != nil {
			return nil, err
		}
	}
	review := in.DeepCopy()
	if r.tokens == nil {
		return review, nil
	}
	auds := authenticator.Audiences(review.Spec.Audiences)
	if len(auds) == 0 {
		auds = apiAudiences
	}
	resp, ok, err := r.tokens.AuthenticateToken(authenticator.WithAudiences(ctx, auds), review.Spec.Token)
	if ok && err == nil && resp != nil {
		tokenAuds := authenticator.Audiences(resp.Audiences)
		if len(tokenAuds) == 0 {
			tokenAuds = apiAudiences
		}
		if granted := tokenAuds.Intersect(auds); len(granted) > 0 {
			resp = &authenticator.Response{User: resp.User, Audiences: granted}
		} else if len(resp.Audiences) == 0 {
			resp, ok = nil, false
		} else {
			resp, ok, err = nil, false, fmt.Errorf("token audiences %q is invalid for the target audiences %q", tokenAuds, auds)
		}
	}
	if !ok && err == nil {
		err = errors.New(errInvalidBearerToken)
	}
	review.Status.Authenticated = ok
	if err != nil {
		review.Status.Error = err.Error()
	}
	if resp != nil && resp.User != nil {
		review.Status.User = authenticationv1.UserInfo{
			Username: resp.User.GetName(),
			UID:      resp.User.GetUID(),
			Groups:   resp.User.GetGroups(),
			Extra:    map[string]authenticationv1.ExtraValue{},
		}
		for k, v := range resp.User.GetExtra() {
			review.Status.User.Extra[k] = authenticationv1.ExtraValue(v)
		}
		review.Status.Audiences = resp.Audiences
	}
	return review, nil
}

// selfSubjectReviewREST answers authentication.k8s.io/v1 SelfSubjectReviews (`kubectl auth whoami`) with
// the requester's own identity, as kube-apiserver does.
type selfSubjectReviewREST struct{}

var _ rest.Creater = selfSubjectReviewREST{}

func (selfSubjectReviewREST) New() runtime.Object     { return &authenticationv1.SelfSubjectReview{} }
func (selfSubjectReviewREST) Destroy()                {}
func (selfSubjectReviewREST) NamespaceScoped() bool   { return false }
func (selfSubjectReviewREST) GetSingularName() string { return "selfsubjectreview" }

func (selfSubjectReviewREST) Create(ctx context.Context, obj runtime.Object, createValidation rest.ValidateObjectFunc, options *metav1.CreateOptions) (runtime.Object, error) {
	if createValidation != nil {
		if err := createValidation(ctx, obj); err != nil {
			return nil, err
		}
	}
	u, ok := genericapirequest.UserFrom(ctx)
	if !ok {
		return nil, apierrors.NewBadRequest("no user in the request")
	}
	review := &authenticationv1.SelfSubjectReview{ObjectMeta: metav1.ObjectMeta{CreationTimestamp: metav1.Now()}}
	review.Status.UserInfo = authenticationv1.UserInfo{Username: u.GetName(), UID: u.GetUID(), Groups: u.GetGroups()}
	for k, v := range u.GetExtra() {
		if review.Status.UserInfo.Extra == nil {
			review.Status.UserInfo.Extra = map[string]authenticationv1.ExtraValue{}
		}
		review.Status.UserInfo.Extra[k] = v
	}
	return review, nil
}
