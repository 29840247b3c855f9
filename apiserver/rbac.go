package apiserver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/operation"
	apimachineryvalidation "k8s.io/apimachinery/pkg/api/validation"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
	kapihelper "k8s.io/kubernetes/pkg/apis/core/helper"
	"k8s.io/kubernetes/pkg/apis/rbac"
	rbacv1helpers "k8s.io/kubernetes/pkg/apis/rbac/v1"
	rbacvalidation "k8s.io/kubernetes/pkg/apis/rbac/validation"
	rbacregistry "k8s.io/kubernetes/pkg/registry/rbac"
	rbacregistryvalidation "k8s.io/kubernetes/pkg/registry/rbac/validation"
)

// The rbac.authorization.k8s.io/v1 kinds are validated by Kubernetes' own code: the stored v1 object is
// converted to kube's internal type with kube's generated conversions, checked by pkg/apis/rbac/validation as
// kube's registry strategies do, and then by kube's declarative validation (the generated v1 validations,
// merged as rest.DeclarativeValidation merges them in kube-apiserver). Writes are guarded against privilege
// escalation as kube's policybased storages guard them (rbacEscalationStorage).

// rbacScheme knows kube's internal RBAC types and the v1 ones with their generated conversions, defaults and
// declarative validations; the declarative validation converts through it.
var rbacScheme = runtime.NewScheme()

func init() {
	utilruntime.Must(rbac.AddToScheme(rbacScheme))
	utilruntime.Must(rbacv1helpers.AddToScheme(rbacScheme))
}

// rbacNameFunc is the name rule Kubernetes applies to RBAC objects (a path segment, so "system:node" is valid).
var rbacNameFunc = apimachineryvalidation.ValidateNameFunc(rbacvalidation.ValidateRBACName)

// Validation funcs for the kinds table. Each returns exactly what kube-apiserver returns for the object, minus
// the generic ObjectMeta errors Skiff's strategy reports itself (validateMeta, and
// ValidateObjectMetaAccessorUpdate on update), so that nothing is reported twice. The create funcs go in
// validateCreate and the update funcs in validateUpdate; validate stays nil, since the update funcs run the
// create checks themselves, as kube's ValidateXUpdate do.

func validateRole(obj runtime.Object) field.ErrorList {
	role := obj.(*rbacv1.Role)
	in := &rbac.Role{}
	if err := rbacv1helpers.Convert_v1_Role_To_rbac_Role(role, in, nil); err != nil {
		return field.ErrorList{field.InternalError(nil, err)}
	}
	errs := rbacvalidation.ValidateRole(in)
	errs = rbacDeclarative("roles", in, nil, errs, rest.DeclarativeValidationConfig{})
	errs = append(errs, validateRuleVerbs(role.Rules, nil)...)
	return withoutGenericMeta(errs, &role.ObjectMeta, nil, true)
}

func validateRoleUpdate(obj, old runtime.Object) field.ErrorList {
	role, oldRole := obj.(*rbacv1.Role), old.(*rbacv1.Role)
	in, oldIn := &rbac.Role{}, &rbac.Role{}
	if err := rbacv1helpers.Convert_v1_Role_To_rbac_Role(role, in, nil); err != nil {
		return field.ErrorList{field.InternalError(nil, err)}
	}
	if err := rbacv1helpers.Convert_v1_Role_To_rbac_Role(oldRole, oldIn, nil); err != nil {
		return field.ErrorList{field.InternalError(nil, err)}
	}
	errs := rbacvalidation.ValidateRoleUpdate(in, oldIn)
	errs = rbacDeclarative("roles", in, oldIn, errs, rest.DeclarativeValidationConfig{})
	errs = append(errs, validateRuleVerbs(role.Rules, oldRole.Rules)...)
	return withoutGenericMeta(errs, &role.ObjectMeta, &oldRole.ObjectMeta, true)
}

func validateClusterRole(obj runtime.Object) field.ErrorList {
	role := obj.(*rbacv1.ClusterRole)
	in := &rbac.ClusterRole{}
	if err := rbacv1helpers.Convert_v1_ClusterRole_To_rbac_ClusterRole(role, in, nil); err != nil {
		return field.ErrorList{field.InternalError(nil, err)}
	}
	errs := rbacvalidation.ValidateClusterRole(in, rbacvalidation.ClusterRoleValidationOptions{AllowInvalidLabelValueInSelector: false})
	errs = rbacDeclarative("clusterroles", in, nil, errs, rest.DeclarativeValidationConfig{})
	errs = append(errs, validateRuleVerbs(role.Rules, nil)...)
	return withoutGenericMeta(errs, &role.ObjectMeta, nil, false)
}

func validateClusterRoleUpdate(obj, old runtime.Object) field.ErrorList {
	role, oldRole := obj.(*rbacv1.ClusterRole), old.(*rbacv1.ClusterRole)
	in, oldIn := &rbac.ClusterRole{}, &rbac.ClusterRole{}
	if err := rbacv1helpers.Convert_v1_ClusterRole_To_rbac_ClusterRole(role, in, nil); err != nil {
		return field.ErrorList{field.InternalError(nil, err)}
	}
	if err := rbacv1helpers.Convert_v1_ClusterRole_To_rbac_ClusterRole(oldRole, oldIn, nil); err != nil {
		return field.ErrorList{field.InternalError(nil, err)}
	}
	// As kube's clusterrole strategy: a selector already stored with an invalid label value may stay.
	opts := rbacvalidation.ClusterRoleValidationOptions{AllowInvalidLabelValueInSelector: hasInvalidLabelValueInLabelSelector(oldIn)}
	errs := rbacvalidation.ValidateClusterRoleUpdate(in, oldIn, opts)
	errs = rbacDeclarative("clusterroles", in, oldIn, errs, rest.DeclarativeValidationConfig{})
	errs = append(errs, validateRuleVerbs(role.Rules, oldRole.Rules)...)
	return withoutGenericMeta(errs, &role.ObjectMeta, &oldRole.ObjectMeta, false)
}

func validateRoleBinding(obj runtime.Object) field.ErrorList {
	binding := obj.(*rbacv1.RoleBinding)
	in := &rbac.RoleBinding{}
	if err := rbacv1helpers.Convert_v1_RoleBinding_To_rbac_RoleBinding(binding, in, nil); err != nil {
		return field.ErrorList{field.InternalError(nil, err)}
	}
	errs := rbacvalidation.ValidateRoleBinding(in)
	// kube's rolebinding strategy matches short-circuited declarative errors with handwritten subfield ones.
	errs = rbacDeclarative("rolebindings", in, nil, errs, rest.DeclarativeValidationConfig{ShortCircuitMismatch: true})
	return withoutGenericMeta(errs, &binding.ObjectMeta, nil, true)
}

func validateRoleBindingUpdate(obj, old runtime.Object) field.ErrorList {
	binding, oldBinding := obj.(*rbacv1.RoleBinding), old.(*rbacv1.RoleBinding)
	in, oldIn := &rbac.RoleBinding{}, &rbac.RoleBinding{}
	if err := rbacv1helpers.Convert_v1_RoleBinding_To_rbac_RoleBinding(binding, in, nil); err != nil {
		return field.ErrorList{field.InternalError(nil, err)}
	}
	if err := rbacv1helpers.Convert_v1_RoleBinding_To_rbac_RoleBinding(oldBinding, oldIn, nil); err != nil {
		return field.ErrorList{field.InternalError(nil, err)}
	}
	errs := rbacvalidation.ValidateRoleBindingUpdate(in, oldIn)
	errs = rbacDeclarative("rolebindings", in, oldIn, errs, rest.DeclarativeValidationConfig{ShortCircuitMismatch: true})
	return withoutGenericMeta(errs, &binding.ObjectMeta, &oldBinding.ObjectMeta, true)
}

func validateClusterRoleBinding(obj runtime.Object) field.ErrorList {
	binding := obj.(*rbacv1.ClusterRoleBinding)
	in := &rbac.ClusterRoleBinding{}
	if err := rbacv1helpers.Convert_v1_ClusterRoleBinding_To_rbac_ClusterRoleBinding(binding, in, nil); err != nil {
		return field.ErrorList{field.InternalError(nil, err)}
	}
	errs := rbacvalidation.ValidateClusterRoleBinding(in)
	errs = rbacDeclarative("clusterrolebindings", in, nil, errs, rest.DeclarativeValidationConfig{ShortCircuitMismatch: true})
	return withoutGenericMeta(errs, &binding.ObjectMeta, nil, false)
}

func validateClusterRoleBindingUpdate(obj, old runtime.Object) field.ErrorList {
	binding, oldBinding := obj.(*rbacv1.ClusterRoleBinding), old.(*rbacv1.ClusterRoleBinding)
	in, oldIn := &rbac.ClusterRoleBinding{}, &rbac.ClusterRoleBinding{}
	if err := rbacv1helpers.Convert_v1_ClusterRoleBinding_To_rbac_ClusterRoleBinding(binding, in, nil); err != nil {
		return field.ErrorList{field.InternalError(nil, err)}
	}
	if err := rbacv1helpers.Convert_v1_ClusterRoleBinding_To_rbac_ClusterRoleBinding(oldBinding, oldIn, nil); err != nil {
		return field.ErrorList{field.InternalError(nil, err)}
	}
	errs := rbacvalidation.ValidateClusterRoleBindingUpdate(in, oldIn)
	errs = rbacDeclarative("clusterrolebindings", in, oldIn, errs, rest.DeclarativeValidationConfig{ShortCircuitMismatch: true})
	return withoutGenericMeta(errs, &binding.ObjectMeta, &oldBinding.ObjectMeta, false)
}

// defaultRoleBinding and defaultClusterRoleBinding are kube's v1 defaults (roleRef.apiGroup, and subjects'
// apiGroup by kind), for the kinds table's defaults so objects written in-process get them too.
func defaultRoleBinding(obj runtime.Object) {
	rbacv1helpers.SetObjectDefaults_RoleBinding(obj.(*rbacv1.RoleBinding))
}

func defaultClusterRoleBinding(obj runtime.Object) {
	rbacv1helpers.SetObjectDefaults_ClusterRoleBinding(obj.(*rbacv1.ClusterRoleBinding))
}

// rbacDeclarative runs kube's declarative validation of the object after the handwritten one (errs), as
// rest.BeforeCreate and rest.BeforeUpdate do for kube's RBAC strategies: covered handwritten errors are
// replaced by the enforced declarative ones, under the same feature gates.
func rbacDeclarative(resource string, obj, old runtime.Object, errs field.ErrorList, config rest.DeclarativeValidationConfig) field.ErrorList {
	op, verb := operation.Create, "create"
	if old != nil {
		op, verb = operation.Update, "update"
	}
	ctx := genericapirequest.WithRequestInfo(context.Background(), &genericapirequest.RequestInfo{
		IsResourceRequest: true, Verb: verb, APIPrefix: "apis", APIGroup: rbacv1.GroupName, APIVersion: "v1", Resource: resource,
	})
	return rest.ValidateDeclarativelyWithMigrationChecks(ctx, rbacScheme, obj, old, errs, op, config)
}

// validateRuleVerbs refuses a verb that is empty or holds whitespace, which Kubernetes lets through (it only
// requires a non-empty list) but which can never match a request. Like tightened validation in Kubernetes it
// ratchets: on update a verb the old object already had is let stay, so existing objects remain updatable.
func validateRuleVerbs(rules, oldRules []rbacv1.PolicyRule) field.ErrorList {
	had := map[string]bool{}
	for _, rule := range oldRules {
		for _, verb := range rule.Verbs {
			had[verb] = true
		}
	}
	var errs field.ErrorList
	for i, rule := range rules {
		for j, verb := range rule.Verbs {
			if had[verb] {
				continue
			}
			path := field.NewPath("rules").Index(i).Child("verbs").Index(j)
			switch {
			case verb == "":
				errs = append(errs, field.Invalid(path, verb, "must not be empty"))
			case strings.IndexFunc(verb, unicode.IsSpace) >= 0:
				errs = append(errs, field.Invalid(path, verb, "must not contain whitespace"))
			}
		}
	}
	return errs
}

// withoutGenericMeta drops from kube's errors the generic ObjectMeta ones, which Skiff's strategy reports on
// its own (validateMeta, and ValidateObjectMetaAccessorUpdate on update). What kube adds beyond them (its
// finalizer-name rule) is kept. The name errors are computed with kube's RBAC name rule, so the strategy's
// name rule is the one that speaks: Kubernetes' exactly when the strategy validates these kinds' names with
// rbacvalidation.ValidateRBACName.
func withoutGenericMeta(errs field.ErrorList, m, old *metav1.ObjectMeta, namespaced bool) field.ErrorList {
	if len(errs) == 0 {
		return errs
	}
	path := field.NewPath("metadata")
	generic := apimachineryvalidation.ValidateObjectMeta(m, namespaced, rbacNameFunc, path)
	if old != nil {
		generic = append(generic, apimachineryvalidation.ValidateObjectMetaUpdate(m, old, path)...)
	}
	if len(generic) == 0 {
		return errs
	}
	seen := map[string]bool{}
	for _, e := range generic {
		seen[e.Error()] = true
	}
	out := field.ErrorList{}
	for _, e := range errs {
		if !seen[e.Error()] {
			out = append(out, e)
		}
	}
	return out
}

// hasInvalidLabelValueInLabelSelector is kube's clusterrole strategy's test of the stored object.
func hasInvalidLabelValueInLabelSelector(role *rbac.ClusterRole) bool {
	if role.AggregationRule != nil {
		opts := metav1validation.LabelSelectorValidationOptions{AllowInvalidLabelValueInSelector: false}
		for _, selector := range role.AggregationRule.ClusterRoleSelectors {
			if len(metav1validation.ValidateLabelSelector(&selector, opts, nil)) > 0 {
				return true
			}
		}
	}
	return false
}

// rbacEscalationStorage is the registry store of one RBAC kind with kube's escalation check on create and
// update (pkg/registry/rbac/{role,clusterrole,rolebinding,clusterrolebinding}/policybased). Everything else,
// short names and categories included, is the embedded resource's.
type rbacEscalationStorage struct {
	*resource
	authorizer authorizer.Authorizer
	rules      rbacregistryvalidation.AuthorizationRuleResolver
}

// wrapRBACEscalation wraps the stores of roles, clusterroles, rolebindings and clusterrolebindings (keyed by
// resource, as restStorage returns them) in the escalation check.
func wrapRBACEscalation(stores map[string]*resource, a authorizer.Authorizer, r rbacregistryvalidation.AuthorizationRuleResolver) map[string]rest.Storage {
	out := map[string]rest.Storage{}
	for _, name := range []string{"roles", "clusterroles", "rolebindings", "clusterrolebindings"} {
		if store, ok := stores[name]; ok && store != nil {
			out[name] = &rbacEscalationStorage{resource: store, authorizer: a, rules: r}
		}
	}
	return out
}

// rbacStoreRules reads roles and bindings from the registry stores, as kube-apiserver's escalation checks read
// them (pkg/registry/rbac/rest/storage_rbac.go builds its resolver over the stores' AuthorizerAdapters), so a
// role or binding written a moment ago counts at once, where a resolver over informers may not see it yet.
type rbacStoreRules struct {
	roles, roleBindings, clusterRoles, clusterRoleBindings *resource
}

// newRBACStoreRuleResolver is kube's rule resolver over the stores of the four RBAC kinds (keyed by resource,
// as for wrapRBACEscalation): the resolver kube-apiserver gives its policybased storages.
func newRBACStoreRuleResolver(stores map[string]*resource) rbacregistryvalidation.AuthorizationRuleResolver {
	s := rbacStoreRules{roles: stores["roles"], roleBindings: stores["rolebindings"],
		clusterRoles: stores["clusterroles"], clusterRoleBindings: stores["clusterrolebindings"]}
	return rbacregistryvalidation.NewDefaultRuleResolver(s, s, s, s)
}

func (s rbacStoreRules) GetRole(ctx context.Context, namespace, name string) (*rbacv1.Role, error) {
	obj, err := s.roles.Get(genericapirequest.WithNamespace(ctx, namespace), name, &metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return obj.(*rbacv1.Role), nil
}

func (s rbacStoreRules) GetClusterRole(ctx context.Context, name string) (*rbacv1.ClusterRole, error) {
	obj, err := s.clusterRoles.Get(genericapirequest.WithNamespace(ctx, metav1.NamespaceNone), name, &metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return obj.(*rbacv1.ClusterRole), nil
}

func (s rbacStoreRules) ListRoleBindings(ctx context.Context, namespace string) ([]*rbacv1.RoleBinding, error) {
	obj, err := s.roleBindings.List(genericapirequest.WithNamespace(ctx, namespace), &metainternalversion.ListOptions{})
	if err != nil {
		return nil, err
	}
	items := obj.(*rbacv1.RoleBindingList).Items
	out := make([]*rbacv1.RoleBinding, 0, len(items))
	for i := range items {
		out = append(out, &items[i])
	}
	return out, nil
}

func (s rbacStoreRules) ListClusterRoleBindings(ctx context.Context) ([]*rbacv1.ClusterRoleBinding, error) {
	obj, err := s.clusterRoleBindings.List(genericapirequest.WithNamespace(ctx, metav1.NamespaceNone), &metainternalversion.ListOptions{})
	if err != nil {
		return nil, err
	}
	items := obj.(*rbacv1.ClusterRoleBindingList).Items
	out := make([]*rbacv1.ClusterRoleBinding, 0, len(items))
	for i := range items {
		out = append(out, &items[i])
	}
	return out, nil
}

func (s *rbacEscalationStorage) Create(ctx context.Context, obj runtime.Object, createValidation rest.ValidateObjectFunc, options *metav1.CreateOptions) (runtime.Object, error) {
	if err := confirmRBACWrite(ctx, s.k.resource, obj, nil, s.authorizer, s.rules); err != nil {
		return nil, err
	}
	return s.resource.Create(ctx, obj, createValidation, options)
}

func (s *rbacEscalationStorage) Update(ctx context.Context, name string, objInfo rest.UpdatedObjectInfo, createValidation rest.ValidateObjectFunc,
	updateValidation rest.ValidateObjectUpdateFunc, forceAllowCreate bool, options *metav1.UpdateOptions) (runtime.Object, bool, error) {
	if rbacWriteAllowed(ctx, s.k.resource, s.authorizer) {
		// As kube: a user who may escalate is not checked against the object at all.
		return s.resource.Update(ctx, name, objInfo, createValidation, updateValidation, forceAllowCreate, options)
	}
	resource := s.k.resource
	checked := rest.WrapUpdatedObjectInfo(objInfo, func(ctx context.Context, obj, old runtime.Object) (runtime.Object, error) {
		if err := confirmRBACObject(ctx, resource, obj, old, s.authorizer, s.rules); err != nil {
			return nil, err
		}
		return obj, nil
	})
	return s.resource.Update(ctx, name, checked, createValidation, updateValidation, forceAllowCreate, options)
}

// rbacWriteAllowed is the check kube's policybased storages make before looking at the object: a member of
// system:masters, or for roles a user granted the escalate verb on it.
func rbacWriteAllowed(ctx context.Context, resource string, a authorizer.Authorizer) bool {
	if rbacregistry.EscalationAllowed(ctx) {
		return true
	}
	switch resource {
	case "roles", "clusterroles":
		return rbacregistry.RoleEscalationAuthorized(ctx, a)
	}
	return false
}

// fullAuthority is kube's clusterrole policybased storage's bar for the aggregationRule: * on *.* and on
// every non-resource URL.
var fullAuthority = []rbacv1.PolicyRule{
	rbacv1helpers.NewRule("*").Groups("*").Resources("*").RuleOrDie(),
	rbacv1helpers.NewRule("*").URLs("*").RuleOrDie(),
}

// confirmRBACWrite is kube's escalation check of a write of obj to resource (roles, clusterroles,
// rolebindings or clusterrolebindings); old is the stored object on update, nil on create. It returns nil
// when the write may go ahead, else the error kube-apiserver answers with: 403 Forbidden naming the
// permissions the user does not hold.
func confirmRBACWrite(ctx context.Context, resource string, obj, old runtime.Object, a authorizer.Authorizer, r rbacregistryvalidation.AuthorizationRuleResolver) error {
	if rbacWriteAllowed(ctx, resource, a) {
		return nil
	}
	return confirmRBACObject(ctx, resource, obj, old, a, r)
}

// confirmRBACObject is the part of confirmRBACWrite that looks at the object, which an update runs on the
// object objInfo.UpdatedObject produces.
func confirmRBACObject(ctx context.Context, resource string, obj, old runtime.Object, a authorizer.Authorizer, r rbacregistryvalidation.AuthorizationRuleResolver) error {
	groupResource := rbac.Resource(resource)
	// if we're only mutating fields needed for the GC to eventually delete this obj, return
	onlyGC := func() bool { return old != nil && rbacregistry.IsOnlyMutatingGCFields(obj, old, kapihelper.Semantic) }

	switch o := obj.(type) {
	case *rbacv1.Role:
		if onlyGC() {
			return nil
		}
		if err := rbacregistryvalidation.ConfirmNoEscalation(ctx, r, o.Rules); err != nil {
			return apierrors.NewForbidden(groupResource, o.Name, err)
		}
		return nil

	case *rbacv1.ClusterRole:
		if onlyGC() {
			return nil
		}
		if err := rbacregistryvalidation.ConfirmNoEscalation(ctx, r, o.Rules); err != nil {
			return apierrors.NewForbidden(groupResource, o.Name, err)
		}
		// to set or change the aggregation rule, since it can gather anything and prevent tightening,
		// requires * on *.*
		oldRole, _ := old.(*rbacv1.ClusterRole)
		if hasAggregationRule(o) || (oldRole != nil && hasAggregationRule(oldRole)) {
			if err := rbacregistryvalidation.ConfirmNoEscalation(ctx, r, fullAuthority); err != nil {
				return apierrors.NewForbidden(groupResource, o.Name, errors.New("must have cluster-admin privileges to use the aggregationRule"))
			}
		}
		return nil

	case *rbacv1.RoleBinding:
		// The namespace comes from the request: the object's may be empty until the store fills it in.
		namespace, ok := genericapirequest.NamespaceFrom(ctx)
		if !ok {
			return apierrors.NewBadRequest("namespace is required")
		}
		if onlyGC() {
			return nil
		}
		return confirmBinding(ctx, groupResource, o.Name, o.RoleRef, namespace, a, r)

	case *rbacv1.ClusterRoleBinding:
		if onlyGC() {
			return nil
		}
		return confirmBinding(ctx, groupResource, o.Name, o.RoleRef, metav1.NamespaceNone, a, r)
	}
	return apierrors.NewInternalError(fmt.Errorf("escalation check: unexpected %T for %s", obj, resource))
}

// confirmBinding lets a binding through when the user may bind its role, or already holds every permission
// the role grants.
func confirmBinding(ctx context.Context, groupResource schema.GroupResource, name string, roleRef rbacv1.RoleRef, namespace string,
	a authorizer.Authorizer, r rbacregistryvalidation.AuthorizationRuleResolver) error {
	internalRef := rbac.RoleRef{}
	if err := rbacv1helpers.Convert_v1_RoleRef_To_rbac_RoleRef(&roleRef, &internalRef, nil); err != nil {
		return err
	}
	// if we're explicitly authorized to bind this role, return
	if rbacregistry.BindingAuthorized(ctx, internalRef, namespace, a) {
		return nil
	}
	// Otherwise, see if we already have all the permissions contained in the referenced role
	rules, err := r.GetRoleReferenceRules(ctx, roleRef, namespace)
	if err != nil {
		return err
	}
	if err := rbacregistryvalidation.ConfirmNoEscalation(ctx, r, rules); err != nil {
		return apierrors.NewForbidden(groupResource, name, err)
	}
	return nil
}

func hasAggregationRule(clusterRole *rbacv1.ClusterRole) bool {
	return clusterRole.AggregationRule != nil && len(clusterRole.AggregationRule.ClusterRoleSelectors) > 0
}
