package apiserver

import (
	"context"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
	rbacregistryvalidation "k8s.io/kubernetes/pkg/registry/rbac/validation"
)

func rbacRule(verbs, groups, resources []string) rbacv1.PolicyRule {
	return rbacv1.PolicyRule{Verbs: verbs, APIGroups: groups, Resources: resources}
}

func rbacRef(kind, name string) rbacv1.RoleRef {
	return rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: kind, Name: name}
}

func rbacErrorStrings(errs field.ErrorList) []string {
	var out []string
	for _, e := range errs {
		out = append(out, e.Error())
	}
	return out
}

// TestRBACValidation checks that the four kinds get Kubernetes' validation, with its field paths and
// messages, plus Skiff's rule that a verb is neither empty nor holds whitespace.
func TestRBACValidation(t *testing.T) {
	meta := metav1.ObjectMeta{Name: "r", Namespace: "team"}
	clusterMeta := metav1.ObjectMeta{Name: "r"}
	role := func(rules ...rbacv1.PolicyRule) *rbacv1.Role { return &rbacv1.Role{ObjectMeta: meta, Rules: rules} }
	binding := func(ref rbacv1.RoleRef) *rbacv1.RoleBinding {
		return &rbacv1.RoleBinding{ObjectMeta: meta, RoleRef: ref,
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "alice"}}}
	}
	clusterBinding := func(ref rbacv1.RoleRef) *rbacv1.ClusterRoleBinding {
		return &rbacv1.ClusterRoleBinding{ObjectMeta: clusterMeta, RoleRef: ref,
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "sa", Namespace: "team"}}}
	}
	pods := []string{"pods"}
	core := []string{""}

	cases := []struct {
		name string
		errs field.ErrorList
		want []string
	}{
		{"valid role with an RBAC name", validateRole(&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "system:controller:x", Namespace: "team"},
			Rules: []rbacv1.PolicyRule{rbacRule([]string{"get"}, core, pods)}}), nil},
		// Kubernetes 1.37's declarative validation (DeclarativeValidationBeta, on by default) reports the
		// missing verbs in place of the handwritten "verbs must contain at least one value".
		{"missing verbs", validateRole(role(rbacRule(nil, core, pods))),
			[]string{"rules[0].verbs: Required value"}},
		{"empty verb", validateRole(role(rbacRule([]string{"get", ""}, core, pods))),
			[]string{`rules[0].verbs[1]: Invalid value: "": must not be empty`}},
		{"verb with whitespace", validateClusterRole(&rbacv1.ClusterRole{ObjectMeta: clusterMeta,
			Rules: []rbacv1.PolicyRule{rbacRule([]string{"get"}, core, pods), rbacRule([]string{"li st"}, core, pods)}}),
			[]string{`rules[1].verbs[0]: Invalid value: "li st": must not contain whitespace`}},
		{"namespaced rule with nonResourceURLs", validateRole(role(rbacv1.PolicyRule{Verbs: []string{"get"}, NonResourceURLs: []string{"/healthz"}})),
			[]string{`rules[0].nonResourceURLs: Invalid value: ["/healthz"]: namespaced rules cannot apply to non-resource URLs`}},
		{"cluster rule with resources and nonResourceURLs", validateClusterRole(&rbacv1.ClusterRole{ObjectMeta: clusterMeta,
			Rules: []rbacv1.PolicyRule{{Verbs: []string{"get"}, Resources: pods, NonResourceURLs: []string{"/healthz"}}}}),
			[]string{`rules[0].nonResourceURLs: Invalid value: ["/healthz"]: rules cannot apply to both regular resources and non-resource URLs`}},
		{"resource rule without apiGroups", validateRole(role(rbacRule([]string{"get"}, nil, pods))),
			[]string{"rules[0].apiGroups: Required value: resource rules must supply at least one api group"}},
		{"aggregationRule without selectors", validateClusterRole(&rbacv1.ClusterRole{ObjectMeta: clusterMeta, AggregationRule: &rbacv1.AggregationRule{}}),
			[]string{"aggregationRule.clusterRoleSelectors: Required value: at least one clusterRoleSelector required if aggregationRule is non-nil"}},
		{"binding to a bad roleRef kind", validateRoleBinding(binding(rbacRef("Pod", "x"))),
			[]string{`roleRef.kind: Unsupported value: "Pod": supported values: "Role", "ClusterRole"`}},
		{"binding to a bad roleRef apiGroup", validateRoleBinding(binding(rbacv1.RoleRef{APIGroup: "example.com", Kind: "Role", Name: "x"})),
			[]string{`roleRef.apiGroup: Unsupported value: "example.com": supported values: "rbac.authorization.k8s.io"`}},
		{"cluster binding to a Role", validateClusterRoleBinding(clusterBinding(rbacRef("Role", "x"))),
			[]string{`roleRef.kind: Unsupported value: "Role": supported values: "ClusterRole"`}},
		{"cluster binding subject without namespace", validateClusterRoleBinding(&rbacv1.ClusterRoleBinding{ObjectMeta: clusterMeta,
			RoleRef: rbacRef("ClusterRole", "x"), Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "sa"}}}),
			[]string{"subjects[0].namespace: Required value"}},
		{"kube's finalizer rule", validateRole(&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "r", Namespace: "team", Finalizers: []string{"foo"}}}),
			[]string{`metadata.finalizers[0]: Invalid value: "foo": name is neither a standard finalizer name nor is it fully qualified`}},
		{"roleRef change", validateRoleBindingUpdate(binding(rbacRef("ClusterRole", "y")), binding(rbacRef("ClusterRole", "x"))),
			[]string{`roleRef: Invalid value: {"APIGroup":"rbac.authorization.k8s.io","Kind":"ClusterRole","Name":"y"}: field is immutable`}},
		{"cluster roleRef change", validateClusterRoleBindingUpdate(clusterBinding(rbacRef("ClusterRole", "y")), clusterBinding(rbacRef("ClusterRole", "x"))),
			[]string{`roleRef: Invalid value: {"APIGroup":"rbac.authorization.k8s.io","Kind":"ClusterRole","Name":"y"}: field is immutable`}},
		{"a new bad verb on update", validateRoleUpdate(role(rbacRule([]string{"get", " "}, core, pods)), role(rbacRule([]string{"get"}, core, pods))),
			[]string{`rules[0].verbs[1]: Invalid value: " ": must not contain whitespace`}},
		{"a bad verb already stored may stay", validateRoleUpdate(role(rbacRule([]string{"get", ""}, core, []string{"pods", "secrets"})),
			role(rbacRule([]string{"get", ""}, core, pods))), nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := rbacErrorStrings(tc.errs)
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Fatalf("errors:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}

// TestRBACValidationThroughStrategy checks the kinds-table wiring (validateCreate and validateUpdate, no
// validate): the strategy reports each error once, metadata ones included.
func TestRBACValidationThroughStrategy(t *testing.T) {
	k := &kind{gv: rbacv1.SchemeGroupVersion, resource: "roles", namespaced: true, newFunc: obj[rbacv1.Role](), newListFunc: obj[rbacv1.RoleList](),
		validateCreate: validateRole, validateUpdate: validateRoleUpdate}
	st := newStrategy(k)
	ctx := context.Background()
	bad := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Finalizers: []string{"foo"}}, Rules: []rbacv1.PolicyRule{rbacRule(nil, []string{""}, []string{"pods"})}}
	old := bad.DeepCopy()
	old.Name, old.Namespace, old.ResourceVersion = "r", "team", "1"
	old.Rules[0].Verbs = []string{"get"}
	for what, errs := range map[string]field.ErrorList{"create": st.Validate(ctx, bad), "update": st.ValidateUpdate(ctx, bad, old)} {
		seen := map[string]bool{}
		for _, e := range rbacErrorStrings(errs) {
			if seen[e] {
				t.Errorf("%s: %q reported twice in %q", what, e, rbacErrorStrings(errs))
			}
			seen[e] = true
		}
		for _, want := range []string{"metadata.name: Required value: name or generateName is required", "metadata.namespace: Required value",
			`metadata.finalizers[0]: Invalid value: "foo": name is neither a standard finalizer name nor is it fully qualified`} {
			if !seen[want] {
				t.Errorf("%s: %q missing from %q", what, want, rbacErrorStrings(errs))
			}
		}
		if !seen["rules[0].verbs: Required value"] {
			t.Errorf("%s: missing verbs not reported: %q", what, rbacErrorStrings(errs))
		}
	}
}

// newRBACStores builds the registry stores of the four RBAC kinds on an in-memory store, as restStorage
// builds them for the server.
func newRBACStores(t *testing.T) map[string]*resource {
	t.Helper()
	getter := &restOptionsGetter{backend: NewMemBackend()}
	stores := map[string]*resource{}
	for _, k := range kinds {
		if k.gv != rbacv1.SchemeGroupVersion {
			continue
		}
		storages, err := k.restStorage(getter)
		if err != nil {
			t.Fatal(err)
		}
		r := storages[k.resource].(*resource)
		t.Cleanup(r.Store.DestroyFunc)
		stores[k.resource] = r
	}
	if len(stores) != 4 {
		t.Fatalf("RBAC stores: %v", stores)
	}
	return stores
}

// rbacFakeAuthorizer allows what its allow func says and records every question.
type rbacFakeAuthorizer struct {
	mu    sync.Mutex
	allow func(authorizer.Attributes) bool
	asked []authorizer.AttributesRecord
}

func (f *rbacFakeAuthorizer) authorizer() authorizer.Authorizer {
	return authorizer.AuthorizerFunc(func(_ context.Context, a authorizer.Attributes) (authorizer.Decision, string, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.asked = append(f.asked, authorizer.AttributesRecord{User: a.GetUser(), Verb: a.GetVerb(), APIGroup: a.GetAPIGroup(),
			APIVersion: a.GetAPIVersion(), Resource: a.GetResource(), Name: a.GetName(), Namespace: a.GetNamespace(), ResourceRequest: a.IsResourceRequest()})
		if f.allow != nil && f.allow(a) {
			return authorizer.DecisionAllow, "", nil
		}
		return authorizer.DecisionNoOpinion, "", nil
	})
}

func (f *rbacFakeAuthorizer) set(allow func(authorizer.Attributes) bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.allow, f.asked = allow, nil
}

func (f *rbacFakeAuthorizer) questions() []authorizer.AttributesRecord {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]authorizer.AttributesRecord(nil), f.asked...)
}

var (
	rbacAlice = &user.DefaultInfo{Name: "alice", Groups: []string{user.AllAuthenticated}}
	rbacRoot  = &user.DefaultInfo{Name: "root", Groups: []string{user.AllAuthenticated}}
	rbacAdmin = &user.DefaultInfo{Name: "admin", Groups: []string{user.SystemPrivilegedGroup, user.AllAuthenticated}}
)

// rbacRequest is the context the API server's handlers give a write of resource: the user, the namespace and
// the request info.
func rbacRequest(u user.Info, verb, resource, namespace, name string) context.Context {
	ctx := genericapirequest.WithNamespace(context.Background(), namespace)
	ctx = genericapirequest.WithUser(ctx, u)
	return genericapirequest.WithRequestInfo(ctx, &genericapirequest.RequestInfo{IsResourceRequest: true, Verb: verb, APIPrefix: "apis",
		APIGroup: rbacv1.GroupName, APIVersion: "v1", Resource: resource, Namespace: namespace, Name: name})
}

// TestRBACEscalation drives the wrapped stores as kube-apiserver's policybased storages are driven: a user
// with edit-like rights may grant what she holds and no more, unless she may escalate or bind, and a member
// of system:masters may do anything.
func TestRBACEscalation(t *testing.T) {
	editVerbs := []string{"get", "list", "watch", "create", "update", "patch", "delete"}
	core := []string{""}
	static := []*rbacv1.ClusterRole{
		{ObjectMeta: metav1.ObjectMeta{Name: "editlike"}, Rules: []rbacv1.PolicyRule{
			rbacRule(editVerbs, core, []string{"pods", "configmaps"}),
			rbacRule(editVerbs, []string{rbacv1.GroupName}, []string{"roles", "rolebindings"}),
		}},
		{ObjectMeta: metav1.ObjectMeta{Name: "adminlike"}, Rules: []rbacv1.PolicyRule{rbacRule([]string{"*"}, core, []string{"pods", "secrets"})}},
		{ObjectMeta: metav1.ObjectMeta{Name: "everything"}, Rules: []rbacv1.PolicyRule{
			rbacRule([]string{"*"}, []string{"*"}, []string{"*"}), {Verbs: []string{"*"}, NonResourceURLs: []string{"*"}},
		}},
	}
	roles := []*rbacv1.Role{{ObjectMeta: metav1.ObjectMeta{Name: "pod-reader", Namespace: "team"}, Rules: []rbacv1.PolicyRule{rbacRule([]string{"get", "list"}, core, []string{"pods"})}}}
	bindings := []*rbacv1.RoleBinding{{ObjectMeta: metav1.ObjectMeta{Name: "alice-edit", Namespace: "team"}, RoleRef: rbacRef("ClusterRole", "editlike"),
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "alice"}}}}
	clusterBindings := []*rbacv1.ClusterRoleBinding{{ObjectMeta: metav1.ObjectMeta{Name: "root"}, RoleRef: rbacRef("ClusterRole", "everything"),
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "root"}}}}
	_, getters := rbacregistryvalidation.NewTestRuleResolver(roles, bindings, static, clusterBindings)
	resolver := rbacregistryvalidation.NewDefaultRuleResolver(getters, getters, getters, getters)
	fake := &rbacFakeAuthorizer{}
	wrapped := wrapRBACEscalation(newRBACStores(t), fake.authorizer(), resolver)

	create := func(u user.Info, resource string, o runtime.Object) error {
		m := o.(metav1.Object)
		_, err := wrapped[resource].(rest.Creater).Create(rbacRequest(u, "create", resource, m.GetNamespace(), m.GetName()), o,
			rest.ValidateAllObjectFunc, &metav1.CreateOptions{})
		return err
	}
	update := func(u user.Info, resource, namespace, name string, change func(runtime.Object)) error {
		info := rest.DefaultUpdatedObjectInfo(nil, func(_ context.Context, _, old runtime.Object) (runtime.Object, error) {
			o := old.DeepCopyObject()
			change(o)
			return o, nil
		})
		_, _, err := wrapped[resource].(rest.Updater).Update(rbacRequest(u, "update", resource, namespace, name), name, info,
			rest.ValidateAllObjectFunc, rest.ValidateAllObjectUpdateFunc, false, &metav1.UpdateOptions{})
		return err
	}
	wantForbidden := func(t *testing.T, err error, want string) {
		t.Helper()
		if !apierrors.IsForbidden(err) {
			t.Fatalf("error %v, want 403", err)
		}
		if err.Error() != want {
			t.Fatalf("message:\n%s\nwant:\n%s", err.Error(), want)
		}
	}
	ok := func(t *testing.T, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	namedRole := func(name string, rules ...rbacv1.PolicyRule) *rbacv1.Role {
		return &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team"}, Rules: rules}
	}
	namedBinding := func(name string, ref rbacv1.RoleRef) *rbacv1.RoleBinding {
		return &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team"}, RoleRef: ref,
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "bob"}}}
	}
	allPods := rbacRule([]string{"*"}, core, []string{"pods"})
	aggregation := &rbacv1.AggregationRule{ClusterRoleSelectors: []metav1.LabelSelector{{MatchLabels: map[string]string{"agg": "yes"}}}}
	const notHeld = ` is forbidden: user "alice" (groups=["system:authenticated"]) is attempting to grant RBAC permissions not currently held:` + "\n"

	t.Run("a role within the user's rights", func(t *testing.T) {
		fake.set(nil)
		ok(t, create(rbacAlice, "roles", namedRole("readers", rbacRule([]string{"get", "list"}, core, []string{"pods"}))))
	})
	t.Run("a role beyond the user's rights", func(t *testing.T) {
		fake.set(nil)
		wantForbidden(t, create(rbacAlice, "roles", namedRole("wide", allPods)),
			`roles.rbac.authorization.k8s.io "wide"`+notHeld+`{APIGroups:[""], Resources:["pods"], Verbs:["*"]}`)
	})
	t.Run("a role beyond the user's rights with escalate", func(t *testing.T) {
		fake.set(func(a authorizer.Attributes) bool {
			return a.GetUser().GetName() == "alice" && a.GetVerb() == "escalate"
		})
		ok(t, create(rbacAlice, "roles", namedRole("wide", allPods)))
		want := authorizer.AttributesRecord{User: rbacAlice, Verb: "escalate", APIGroup: rbacv1.GroupName, APIVersion: "*", Resource: "roles",
			Name: "wide", Namespace: "team", ResourceRequest: true}
		if q := fake.questions(); len(q) != 1 || !reflect.DeepEqual(q[0], want) {
			t.Fatalf("authorizer asked %+v, want %+v", q, want)
		}
	})
	t.Run("a binding to a role within the user's rights", func(t *testing.T) {
		fake.set(nil)
		ok(t, create(rbacAlice, "rolebindings", namedBinding("readers", rbacRef("Role", "pod-reader"))))
	})
	t.Run("a binding to a role beyond the user's rights", func(t *testing.T) {
		fake.set(nil)
		wantForbidden(t, create(rbacAlice, "rolebindings", namedBinding("admins", rbacRef("ClusterRole", "adminlike"))),
			`rolebindings.rbac.authorization.k8s.io "admins"`+notHeld+
				`{APIGroups:[""], Resources:["pods"], Verbs:["*"]}`+"\n"+`{APIGroups:[""], Resources:["secrets"], Verbs:["*"]}`)
	})
	t.Run("a binding to a role beyond the user's rights with bind", func(t *testing.T) {
		fake.set(func(a authorizer.Attributes) bool { return a.GetVerb() == "bind" && a.GetName() == "adminlike" })
		ok(t, create(rbacAlice, "rolebindings", namedBinding("admins", rbacRef("ClusterRole", "adminlike"))))
		want := authorizer.AttributesRecord{User: rbacAlice, Verb: "bind", APIGroup: rbacv1.GroupName, APIVersion: "*", Resource: "clusterroles",
			Name: "adminlike", Namespace: "team", ResourceRequest: true}
		if q := fake.questions(); len(q) != 1 || !reflect.DeepEqual(q[0], want) {
			t.Fatalf("authorizer asked %+v, want %+v", q, want)
		}
	})
	t.Run("a cluster binding of rights held in one namespace only", func(t *testing.T) {
		fake.set(nil)
		err := create(rbacAlice, "clusterrolebindings", &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "editors"},
			RoleRef: rbacRef("ClusterRole", "editlike"), Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "bob"}}})
		if !apierrors.IsForbidden(err) || !strings.HasPrefix(err.Error(), `clusterrolebindings.rbac.authorization.k8s.io "editors"`+notHeld) {
			t.Fatalf("error %v, want kube's 403", err)
		}
	})
	t.Run("an aggregating cluster role", func(t *testing.T) {
		fake.set(nil)
		wantForbidden(t, create(rbacAlice, "clusterroles", &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "agg"}, AggregationRule: aggregation}),
			`clusterroles.rbac.authorization.k8s.io "agg" is forbidden: must have cluster-admin privileges to use the aggregationRule`)
		ok(t, create(rbacRoot, "clusterroles", &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "agg"}, AggregationRule: aggregation}))
	})
	t.Run("system:masters may do anything", func(t *testing.T) {
		fake.set(nil)
		ok(t, create(rbacAdmin, "roles", namedRole("big", allPods)))
		ok(t, create(rbacAdmin, "clusterroles", &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "agg2"}, AggregationRule: aggregation}))
		ok(t, create(rbacAdmin, "rolebindings", namedBinding("big", rbacRef("ClusterRole", "everything"))))
		ok(t, create(rbacAdmin, "clusterrolebindings", &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "big"},
			RoleRef: rbacRef("ClusterRole", "everything"), Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "bob"}}}))
		ok(t, update(rbacAdmin, "roles", "team", "big", func(o runtime.Object) { o.(*rbacv1.Role).Labels = map[string]string{"a": "b"} }))
		if q := fake.questions(); len(q) != 0 {
			t.Fatalf("system:masters needed the authorizer: %+v", q)
		}
	})

	t.Run("an update beyond the user's rights", func(t *testing.T) {
		fake.set(nil)
		wantForbidden(t, update(rbacAlice, "roles", "team", "readers", func(o runtime.Object) { o.(*rbacv1.Role).Rules = []rbacv1.PolicyRule{allPods} }),
			`roles.rbac.authorization.k8s.io "readers"`+notHeld+`{APIGroups:[""], Resources:["pods"], Verbs:["*"]}`)
		got, err := wrapped["roles"].(rest.Getter).Get(rbacRequest(rbacAlice, "get", "roles", "team", "readers"), "readers", &metav1.GetOptions{})
		ok(t, err)
		if rules := got.(*rbacv1.Role).Rules; len(rules) != 1 || rules[0].Verbs[0] != "get" {
			t.Fatalf("the refused update was stored: %+v", rules)
		}
	})
	t.Run("an update of a role beyond the user's rights", func(t *testing.T) {
		fake.set(nil)
		// The garbage collector's fields may change; anything else is checked against the whole new object.
		ok(t, update(rbacAlice, "roles", "team", "big", func(o runtime.Object) { o.(*rbacv1.Role).Finalizers = []string{"example.com/f"} }))
		wantForbidden(t, update(rbacAlice, "roles", "team", "big", func(o runtime.Object) { o.(*rbacv1.Role).Labels = map[string]string{"c": "d"} }),
			`roles.rbac.authorization.k8s.io "big"`+notHeld+`{APIGroups:[""], Resources:["pods"], Verbs:["*"]}`)
		fake.set(func(a authorizer.Attributes) bool { return a.GetVerb() == "escalate" })
		ok(t, update(rbacAlice, "roles", "team", "big", func(o runtime.Object) { o.(*rbacv1.Role).Labels = map[string]string{"c": "d"} }))
	})
	t.Run("an update of a binding beyond the user's rights", func(t *testing.T) {
		fake.set(nil)
		addCarol := func(o runtime.Object) {
			b := o.(*rbacv1.RoleBinding)
			b.Subjects = append(b.Subjects, rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "carol"})
		}
		wantForbidden(t, update(rbacAlice, "rolebindings", "team", "big", addCarol),
			`rolebindings.rbac.authorization.k8s.io "big"`+notHeld+`{APIGroups:["*"], Resources:["*"], Verbs:["*"]}`+"\n"+`{NonResourceURLs:["*"], Verbs:["*"]}`)
		fake.set(func(a authorizer.Attributes) bool {
			return a.GetVerb() == "bind" && a.GetResource() == "clusterroles" && a.GetName() == "everything"
		})
		ok(t, update(rbacAlice, "rolebindings", "team", "big", addCarol))
	})
	t.Run("an update of an aggregating cluster role", func(t *testing.T) {
		fake.set(nil)
		// Taking the aggregationRule away needs cluster-admin rights too: it was there before.
		wantForbidden(t, update(rbacAlice, "clusterroles", "", "agg2", func(o runtime.Object) { o.(*rbacv1.ClusterRole).AggregationRule = nil }),
			`clusterroles.rbac.authorization.k8s.io "agg2" is forbidden: must have cluster-admin privileges to use the aggregationRule`)
		ok(t, update(rbacRoot, "clusterroles", "", "agg2", func(o runtime.Object) { o.(*rbacv1.ClusterRole).AggregationRule = nil }))
	})
}

// TestRBACEscalationStoreRules checks the resolver over the stores: what was written a moment ago counts at
// once, for the user's own rights and for the role a binding refers to.
func TestRBACEscalationStoreRules(t *testing.T) {
	stores := newRBACStores(t)
	wrapped := wrapRBACEscalation(stores, (&rbacFakeAuthorizer{}).authorizer(), newRBACStoreRuleResolver(stores))
	create := func(u user.Info, resource string, o runtime.Object) error {
		m := o.(metav1.Object)
		_, err := wrapped[resource].(rest.Creater).Create(rbacRequest(u, "create", resource, m.GetNamespace(), m.GetName()), o,
			rest.ValidateAllObjectFunc, &metav1.CreateOptions{})
		return err
	}
	core := []string{""}
	podRights := rbacRule([]string{"get", "list", "create"}, core, []string{"pods"})
	for resource, o := range map[string]runtime.Object{
		"clusterroles": &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "pods"}, Rules: []rbacv1.PolicyRule{podRights}},
		"rolebindings": &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "alice-pods", Namespace: "team"}, RoleRef: rbacRef("ClusterRole", "pods"),
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "alice"}}},
		"roles": &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "getter", Namespace: "team"},
			Rules: []rbacv1.PolicyRule{rbacRule([]string{"get"}, core, []string{"pods"})}},
	} {
		if err := create(rbacAdmin, resource, o); err != nil {
			t.Fatal(err)
		}
	}
	// The stores list from their watch caches, which fill once the store has a revision to start from; once
	// filled they answer consistent lists, so what is written next counts at once.
	rules := newRBACStoreRuleResolver(stores)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		_, errRB := rules.RulesFor(context.Background(), rbacAlice, "team")
		if errRB == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("stores not ready: %v", errRB)
		}
	}
	if err := create(rbacAlice, "rolebindings", &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "bob-getter", Namespace: "team"},
		RoleRef: rbacRef("Role", "getter"), Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "bob"}}}); err != nil {
		t.Fatal(err)
	}
	err := create(rbacAlice, "roles", &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "deleter", Namespace: "team"},
		Rules: []rbacv1.PolicyRule{rbacRule([]string{"delete"}, core, []string{"pods"})}})
	if !apierrors.IsForbidden(err) || err.Error() != `roles.rbac.authorization.k8s.io "deleter" is forbidden: user "alice" (groups=["system:authenticated"]) `+
		`is attempting to grant RBAC permissions not currently held:`+"\n"+`{APIGroups:[""], Resources:["pods"], Verbs:["delete"]}` {
		t.Fatalf("error %v, want kube's 403", err)
	}
	// A binding to a role that does not exist is refused with the lookup's error, as kube does.
	err = create(rbacAlice, "rolebindings", &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "ghost", Namespace: "team"},
		RoleRef: rbacRef("Role", "ghost"), Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "bob"}}})
	if !apierrors.IsNotFound(err) {
		t.Fatalf("binding to a missing role: %v, want 404", err)
	}
}

// TestRBACEscalationWrapper checks that the wrapped stores keep the resource's interfaces.
func TestRBACEscalationWrapper(t *testing.T) {
	wrapped := wrapRBACEscalation(newRBACStores(t), nil, nil)
	for _, name := range []string{"roles", "clusterroles", "rolebindings", "clusterrolebindings"} {
		s, found := wrapped[name]
		if !found {
			t.Fatalf("%s not wrapped", name)
		}
		if _, ok := s.(*rbacEscalationStorage); !ok {
			t.Fatalf("%s: %T", name, s)
		}
		if _, ok := s.(rest.StandardStorage); !ok {
			t.Errorf("%s is not a StandardStorage", name)
		}
		for what, ok := range map[string]bool{
			"ShortNamesProvider": func() bool { _, ok := s.(rest.ShortNamesProvider); return ok }(),
			"CategoriesProvider": func() bool { _, ok := s.(rest.CategoriesProvider); return ok }(),
			"TableConvertor":     func() bool { _, ok := s.(rest.TableConvertor); return ok }(),
			"ResetFieldsStrategy": func() bool {
				_, ok := s.(rest.ResetFieldsStrategy)
				return ok
			}(),
			"SingularNameProvider": func() bool { _, ok := s.(rest.SingularNameProvider); return ok }(),
		} {
			if !ok {
				t.Errorf("%s lost %s", name, what)
			}
		}
	}
	// Without a user nothing is allowed, as in kube.
	err := confirmRBACWrite(context.Background(), "roles", &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "r"}}, nil, nil,
		rbacregistryvalidation.NewDefaultRuleResolver(nil, nil, nil, nil))
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "no user on context") {
		t.Fatalf("no user: %v", err)
	}
}
