package auth

import (
	"context"
	"crypto/ecdsa"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/google/uuid"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	"k8s.io/apiserver/pkg/registry/rest"
)

// ServiceAccountIssuer is the "iss" of the service account tokens Skiff issues, and their default audience,
// as kube-apiserver's usual --service-account-issuer.
const ServiceAccountIssuer = "https://kubernetes.default.svc.cluster.local"

// Token lifetimes the TokenRequest API accepts, as in Kubernetes: an hour by default, at least ten minutes.
const (
	defaultTokenSeconds = 3600
	minTokenSeconds     = 600
)

// ServiceAccountTokens issues the bound service account tokens of the TokenRequest API (the serviceaccounts
// "token" subresource) and authenticates them: ES256 JWTs signed with the cluster's service account key,
// with Kubernetes' claims, valid while the ServiceAccount and the object they are bound to still exist with
// the same UIDs.
type ServiceAccountTokens struct {
	key func() (*ecdsa.PrivateKey, error) // nil or failing: no tokens are issued or accepted
	now func() time.Time
	// stores are where the token's ServiceAccount and bound objects are looked up, by kind; package
	// apiserver's installAPIs fills them in (SetStore).
	stores map[string]*genericregistry.Store
}

// NewServiceAccountTokens issues and authenticates tokens signed with key; nil or failing, no tokens are
// issued or accepted.
func NewServiceAccountTokens(key func() (*ecdsa.PrivateKey, error)) *ServiceAccountTokens {
	return &ServiceAccountTokens{key: key, now: time.Now, stores: map[string]*genericregistry.Store{}}
}

// SetStore gives the store where tokens look up objects of a kind: ServiceAccount, and the kinds a token may
// be bound to (Pod, Secret, Node). It is called while the server is built, before it serves.
func (t *ServiceAccountTokens) SetStore(kind string, store *genericregistry.Store) {
	t.stores[kind] = store
}

// TokenRequestStorage is the REST storage of the serviceaccounts "token" subresource.
func (t *ServiceAccountTokens) TokenRequestStorage() rest.Storage {
	return &tokenRequestREST{tokens: t}
}

// boundKinds are the kinds a token may be bound to, as in Kubernetes.
var boundKinds = []string{"Pod", "Secret", "Node"}

type objectRef struct {
	Name string    `json:"name"`
	UID  types.UID `json:"uid"`
}

// tokenClaims are Kubernetes' service account token claims.
type tokenClaims struct {
	jwt.RegisteredClaims
	Kubernetes struct {
		Namespace      string     `json:"namespace"`
		ServiceAccount objectRef  `json:"serviceaccount"`
		Pod            *objectRef `json:"pod,omitempty"`
		Secret         *objectRef `json:"secret,omitempty"`
		Node           *objectRef `json:"node,omitempty"`
	} `json:"kubernetes.io"`
}

// bound returns the claim of a bound kind.
func (c *tokenClaims) bound(kind string) **objectRef {
	switch kind {
	case "Pod":
		return &c.Kubernetes.Pod
	case "Secret":
		return &c.Kubernetes.Secret
	default:
		return &c.Kubernetes.Node
	}
}

// lookup reads an object by kind, namespace (ignored for a cluster-scoped kind) and name. Issuing a token
// reads consistently, so that the token carries the UIDs of the objects as they are now. Authenticating reads
// the watch cache first, and the store itself when the cache does not have the object (yet), so that a token
// for a just-created object works at once.
func (t *ServiceAccountTokens) lookup(ctx context.Context, kind, namespace, name string, consistent bool) (metav1.Object, error) {
	store := t.stores[kind]
	if store == nil {
		return nil, fmt.Errorf("no store for %s", kind)
	}
	if store.NamespaceScoped() { // a Node is looked up without the token's namespace
		ctx = genericapirequest.WithNamespace(ctx, namespace)
	}
	opts := &metav1.GetOptions{ResourceVersion: "0"} // the watch cache
	if consistent {
		opts = &metav1.GetOptions{}
	}
	obj, err := store.Get(ctx, name, opts)
	if apierrors.IsNotFound(err) && !consistent {
		obj, err = store.Get(ctx, name, &metav1.GetOptions{})
	}
	if err != nil {
		return nil, err
	}
	return obj.(metav1.Object), nil
}

// tokenRequestREST is the serviceaccounts/token subresource.
type tokenRequestREST struct {
	tokens *ServiceAccountTokens
}

var _ rest.NamedCreater = &tokenRequestREST{}

func (r *tokenRequestREST) New() runtime.Object { return &authenticationv1.TokenRequest{} }
func (r *tokenRequestREST) Destroy()            {}

func (r *tokenRequestREST) GroupVersionKind(schema.GroupVersion) schema.GroupVersionKind {
	return authenticationv1.SchemeGroupVersion.WithKind("TokenRequest")
}

func (r *tokenRequestREST) Create(ctx context.Context, name string, obj runtime.Object, createValidation rest.ValidateObjectFunc, options *metav1.CreateOptions) (runtime.Object, error) {
	req := obj.(*authenticationv1.TokenRequest).DeepCopy()
	gk := authenticationv1.SchemeGroupVersion.WithKind("TokenRequest").GroupKind()
	if req.Spec.ExpirationSeconds == nil {
		req.Spec.ExpirationSeconds = new(int64(defaultTokenSeconds))
	}
	if errs := validateTokenRequest(req); len(errs) > 0 {
		return nil, apierrors.NewInvalid(gk, name, errs)
	}
	if createValidation != nil {
		if err := createValidation(ctx, req); err != nil {
			return nil, err
		}
	}
	namespace := genericapirequest.NamespaceValue(ctx)
	sa, err := r.tokens.lookup(ctx, "ServiceAccount", namespace, name, true)
	if err != nil {
		return nil, err
	}
	var claims tokenClaims
	claims.Kubernetes.Namespace = namespace
	claims.Kubernetes.ServiceAccount = objectRef{Name: sa.GetName(), UID: sa.GetUID()}
	if ref := req.Spec.BoundObjectRef; ref != nil {
		if ref.APIVersion != "" && ref.APIVersion != "v1" {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("cannot bind token to object of type %s, %s", ref.APIVersion, ref.Kind))
		}
		bound, err := r.tokens.lookup(ctx, ref.Kind, namespace, ref.Name, true)
		if err != nil {
			return nil, err
		}
		if ref.UID != "" && ref.UID != bound.GetUID() {
			return nil, apierrors.NewConflict(schema.GroupResource{Resource: strings.ToLower(ref.Kind) + "s"}, ref.Name,
				fmt.Errorf("the UID in the bound object reference (%s) does not match the UID in record. The object might have been deleted and then recreated", ref.UID))
		}
		if pod, ok := bound.(*corev1.Pod); ok && pod.Spec.ServiceAccountName != name {
			return nil, apierrors.NewBadRequest(fmt.Sprintf("cannot bind token for serviceaccount %q to pod running with different serviceaccount name.", name))
		}
		*claims.bound(ref.Kind) = &objectRef{Name: bound.GetName(), UID: bound.GetUID()}
		req.Spec.BoundObjectRef.UID = bound.GetUID()
		// A token bound to a scheduled pod also names the pod's node, as Kubernetes' do
		// (ServiceAccountTokenPodNodeInfo): a TokenReview then reports it in the user's extra. Without the
		// node at hand the token goes without it.
		if pod, ok := bound.(*corev1.Pod); ok && pod.Spec.NodeName != "" {
			if node, err := r.tokens.lookup(ctx, "Node", "", pod.Spec.NodeName, false); err == nil {
				claims.Kubernetes.Node = &objectRef{Name: node.GetName(), UID: node.GetUID()}
			}
		}
	}
	if len(req.Spec.Audiences) == 0 {
		req.Spec.Audiences = []string{ServiceAccountIssuer}
	}
	if options != nil && len(options.DryRun) > 0 {
		return req, nil
	}
	key, err := r.tokens.key()
	if err != nil {
		return nil, apierrors.NewServiceUnavailable("the service account signing key is not available yet: " + err.Error())
	}
	now := r.tokens.now().Truncate(time.Second)
	expires := now.Add(time.Duration(*req.Spec.ExpirationSeconds) * time.Second)
	claims.RegisteredClaims = jwt.RegisteredClaims{
		Issuer: ServiceAccountIssuer, Subject: serviceaccount.MakeUsername(namespace, name), Audience: req.Spec.Audiences,
		IssuedAt: jwt.NewNumericDate(now), NotBefore: jwt.NewNumericDate(now), ExpiresAt: jwt.NewNumericDate(expires),
		ID: uuid.NewString(),
	}
	kid, err := keyID(&key.PublicKey)
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	unsigned := jwt.NewWithClaims(jwt.SigningMethodES256, &claims)
	unsigned.Header["kid"] = kid // as Kubernetes' tokens: the key set names the key that verifies them
	token, err := unsigned.SignedString(key)
	if err != nil {
		return nil, apierrors.NewInternalError(err)
	}
	req.Status = authenticationv1.TokenRequestStatus{Token: token, ExpirationTimestamp: metav1.NewTime(expires)}
	return req, nil
}

func validateTokenRequest(req *authenticationv1.TokenRequest) field.ErrorList {
	spec := field.NewPath("spec")
	var errs field.ErrorList
	switch seconds := *req.Spec.ExpirationSeconds; {
	case seconds < minTokenSeconds:
		errs = append(errs, field.Invalid(spec.Child("expirationSeconds"), seconds, "may not specify a duration less than 10 minutes"))
	case seconds > math.MaxUint32:
		errs = append(errs, field.Invalid(spec.Child("expirationSeconds"), seconds, "may not specify a duration larger than 2^32 seconds"))
	}
	if ref := req.Spec.BoundObjectRef; ref != nil {
		path := spec.Child("boundObjectRef")
		if !slices.Contains(boundKinds, ref.Kind) {
			errs = append(errs, field.NotSupported(path.Child("kind"), ref.Kind, boundKinds))
		}
		if ref.Name == "" {
			errs = append(errs, field.Required(path.Child("name"), ""))
		}
	}
	return errs
}

// errTokenInvalidated is the answer for a well-signed token whose ServiceAccount or bound object is gone.
var errTokenInvalidated = errors.New("service account token has been invalidated")

// authenticate accepts a token this cluster issued: signed with its key, from its issuer, for its audience,
// not expired, and with its ServiceAccount and bound object still present with the same UIDs. A token that
// is not a JWT of this issuer is not handled (false, nil).
func (t *ServiceAccountTokens) authenticate(ctx context.Context, token string) (*authenticator.Response, bool, error) {
	if t == nil || t.key == nil || strings.Count(token, ".") != 2 {
		return nil, false, nil
	}
	var unverified tokenClaims
	if _, _, err := jwt.NewParser().ParseUnverified(token, &unverified); err != nil || unverified.Issuer != ServiceAccountIssuer {
		return nil, false, nil
	}
	key, err := t.key()
	if err != nil {
		return nil, false, err
	}
	var claims tokenClaims
	_, err = jwt.ParseWithClaims(token, &claims, func(*jwt.Token) (any, error) { return &key.PublicKey, nil },
		jwt.WithValidMethods([]string{jwt.SigningMethodES256.Alg()}), jwt.WithIssuer(ServiceAccountIssuer),
		jwt.WithAudience(ServiceAccountIssuer), jwt.WithExpirationRequired(), jwt.WithTimeFunc(t.now), jwt.WithLeeway(clockSkew))
	if err != nil {
		return nil, false, fmt.Errorf("invalid service account token: %w", err)
	}
	k := claims.Kubernetes
	if claims.Subject != serviceaccount.MakeUsername(k.Namespace, k.ServiceAccount.Name) {
		return nil, false, errors.New("invalid service account token: subject does not match its claims")
	}
	info := serviceaccount.ServiceAccountInfo{Name: k.ServiceAccount.Name, Namespace: k.Namespace, UID: string(k.ServiceAccount.UID)}
	if err := t.stillValid(ctx, "ServiceAccount", k.Namespace, &k.ServiceAccount); err != nil {
		return nil, false, err
	}
	for _, kind := range boundKinds {
		ref := *claims.bound(kind)
		if ref == nil {
			continue
		}
		if kind == "Node" && k.Pod != nil {
			// A pod-bound token's node is information, not a binding: the pod's validity is what counts.
			info.NodeName, info.NodeUID = ref.Name, string(ref.UID)
			continue
		}
		if err := t.stillValid(ctx, kind, k.Namespace, ref); err != nil {
			return nil, false, err
		}
		switch kind {
		case "Pod":
			info.PodName, info.PodUID = ref.Name, string(ref.UID)
		case "Node":
			info.NodeName, info.NodeUID = ref.Name, string(ref.UID)
		}
	}
	if claims.ID != "" {
		info.CredentialID = "JTI=" + claims.ID
	}
	return &authenticator.Response{User: info.UserInfo(), Audiences: authenticator.Audiences{ServiceAccountIssuer}}, true, nil
}

// deletedObjectGrace is how long past its deletion timestamp an object still vouches for its tokens, as in
// Kubernetes.
const deletedObjectGrace = time.Minute

// clockSkew is how far apart the servers' clocks may be for a token issued by one to be valid on another
// (its not-before and expiry), as Kubernetes allows.
const clockSkew = time.Minute

// stillValid checks that the object a token names exists with the same UID and is not past its deletion.
func (t *ServiceAccountTokens) stillValid(ctx context.Context, kind, namespace string, ref *objectRef) error {
	obj, err := t.lookup(ctx, kind, namespace, ref.Name, false)
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("%w: %s %s/%s not found", errTokenInvalidated, kind, namespace, ref.Name)
	}
	if err != nil {
		return err
	}
	if obj.GetUID() != ref.UID {
		return fmt.Errorf("%w: %s %s/%s has UID %s, not %s", errTokenInvalidated, kind, namespace, ref.Name, obj.GetUID(), ref.UID)
	}
	if ts := obj.GetDeletionTimestamp(); ts != nil && ts.Time.Add(deletedObjectGrace).Before(t.now()) {
		return fmt.Errorf("%w: %s %s/%s is being deleted", errTokenInvalidated, kind, namespace, ref.Name)
	}
	return nil
}
