package auth

import (
	"context"
	"fmt"
	"slices"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/user"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/component-helpers/auth/rbac/reconciliation"
	"k8s.io/klog/v2"
	rbachelpers "k8s.io/kubernetes/pkg/apis/rbac/v1"
	"k8s.io/kubernetes/plugin/pkg/auth/authorizer/rbac/bootstrappolicy"

	"github.com/skiff-dev/skiff/internal/join"
)

// skiffClusterRoles and skiffClusterRoleBindings are the policy Skiff adds to Kubernetes' own: a node
// agent also runs the service proxy and cluster DNS, which in Kubernetes run as kube-proxy and CoreDNS,
// enforces NetworkPolicies, and asks the servers for its endpoint's serving certificate; Skiff's scheduler
// reads PriorityClasses.
var (
	skiffClusterRoles = []rbacv1.ClusterRole{
		{ObjectMeta: metav1.ObjectMeta{Name: "skiff:agent"}, Rules: []rbacv1.PolicyRule{
			rbachelpers.NewRule("post").URLs(join.ServingCertPath).RuleOrDie(),
			rbachelpers.NewRule("get").URLs(join.GossipKeyringPath).RuleOrDie(),
			// The servers publish the cluster's DNS address and domain in kube-system/skiff-cluster.
			rbachelpers.NewRule("get", "list", "watch").Groups("").Resources("configmaps").Names("skiff-cluster").RuleOrDie(),
			// Each agent is the local-path provisioner of its node: it watches claims waiting for a volume
			// there and creates and deletes that node's volumes (NodeRestriction keeps it to its own).
			rbachelpers.NewRule("get", "list", "watch").Groups("").Resources("persistentvolumeclaims").RuleOrDie(),
			rbachelpers.NewRule("get", "list", "watch", "create", "delete").Groups("").Resources("persistentvolumes").RuleOrDie(),
			rbachelpers.NewRule("get", "list", "watch").Groups("storage.k8s.io").Resources("storageclasses").RuleOrDie(),
			// Each agent enforces NetworkPolicies on its node's pods (nodeagent/netpol), as a policy engine's
			// per-node daemon does with its own service account in Kubernetes.
			rbachelpers.NewRule("list", "watch").Groups("networking.k8s.io").Resources("networkpolicies").RuleOrDie(),
		}},
		// Skiff's scheduler reads PriorityClasses itself and evicts preemption victims, which kube-scheduler's
		// role does not grant.
		{ObjectMeta: metav1.ObjectMeta{Name: "skiff:scheduler"}, Rules: []rbacv1.PolicyRule{
			rbachelpers.NewRule("get", "list", "watch").Groups("scheduling.k8s.io").Resources("priorityclasses").RuleOrDie(),
			// It evicts preemption victims through the eviction API, which honours PodDisruptionBudgets.
			rbachelpers.NewRule("create").Groups("").Resources("pods/eviction").RuleOrDie(),
		}},
		{ObjectMeta: metav1.ObjectMeta{Name: "skiff:cluster-dns-endpoints"}, Rules: []rbacv1.PolicyRule{
			rbachelpers.NewRule("get", "create", "update").Groups("discovery.k8s.io").Resources("endpointslices").RuleOrDie(),
		}},
		{ObjectMeta: metav1.ObjectMeta{Name: "skiff:cluster-dns"}, Rules: []rbacv1.PolicyRule{
			rbachelpers.NewRule("list", "watch").Groups("").Resources("endpoints", "services", "pods", "namespaces").RuleOrDie(),
			rbachelpers.NewRule("list", "watch").Groups("discovery.k8s.io").Resources("endpointslices").RuleOrDie(),
		}},
	}
	// skiffRoleBindings grant in one namespace: each agent publishes its node's cluster DNS address as an
	// EndpointSlice of kube-dns in kube-system (NodeRestriction keeps each node to its own slice).
	skiffRoleBindings = []rbacv1.RoleBinding{func() rbacv1.RoleBinding {
		b := rbachelpers.NewRoleBinding("skiff:cluster-dns-endpoints", metav1.NamespaceSystem).Groups(user.NodesGroup).BindingOrDie()
		b.RoleRef.Kind = "ClusterRole" // granted in kube-system only
		return b
	}()}
	skiffClusterRoleBindings = []rbacv1.ClusterRoleBinding{
		groupBinding("skiff:agent", "skiff:agent", user.NodesGroup),
		groupBinding("skiff:node-proxier", "system:node-proxier", user.NodesGroup),
		groupBinding("skiff:cluster-dns", "skiff:cluster-dns", user.NodesGroup),
		rbachelpers.NewClusterBinding("skiff:scheduler").Users(user.KubeScheduler).BindingOrDie(),
		// TLS bootstrap, as kubeadm binds it: the join token (system:bootstrappers) may ask for a node client
		// certificate, which the approver grants; a node may renew its own.
		groupBinding("skiff:node-bootstrapper", "system:node-bootstrapper", BootstrappersGroup),
		groupBinding("skiff:node-autoapprove-bootstrap", "system:certificates.k8s.io:certificatesigningrequests:nodeclient", BootstrappersGroup),
		groupBinding("skiff:node-autoapprove-certificate-rotation", "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient", user.NodesGroup),
	}
)

func groupBinding(name, role, group string) rbacv1.ClusterRoleBinding {
	b := rbachelpers.NewClusterBinding(role).Groups(group).BindingOrDie()
	b.Name = name
	return b
}

// RBACPolicyHook reconciles Kubernetes' default roles and bindings (cluster-admin, admin, edit, view,
// system:basic-user, system:discovery, the node, scheduler and controller roles...) and Skiff's own, as
// kube-apiserver's rbac/bootstrap-roles hook does when a server starts: missing ones are created, missing
// rules and subjects added, and objects annotated rbac.authorization.kubernetes.io/autoupdate=false are left
// alone. It retries until it succeeds (writes wait for a Raft quorum), and /readyz fails until then. ready, if
// set, is called once it has.
func RBACPolicyHook(ready func()) genericapiserver.PostStartHookFunc {
	return func(hook genericapiserver.PostStartHookContext) error {
		cfg := rest.CopyConfig(hook.LoopbackClientConfig)
		// The reconciliation's requests take no context: bound each, so that a shutdown is not held.
		cfg.Timeout = 10 * time.Second
		client, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			return err
		}
		for {
			err := reconcileRBACPolicy(hook, client)
			if err == nil {
				break
			}
			klog.InfoS("reconciling the RBAC bootstrap policy", "err", err)
			select {
			case <-hook.Done():
				return nil
			case <-time.After(time.Second):
			}
		}
		klog.InfoS("RBAC bootstrap policy reconciled")
		if ready != nil {
			ready()
		}
		return nil
	}
}

// reconcileRBACPolicy runs Kubernetes' reconciliation of every default role and binding once.
func reconcileRBACPolicy(ctx context.Context, client kubernetes.Interface) error {
	rbac := client.RbacV1()
	var roles []reconciliation.ReconcileRoleOptions
	for _, r := range append(append(bootstrappolicy.ClusterRoles(), bootstrappolicy.ControllerRoles()...), skiffClusterRoles...) {
		roles = append(roles, reconciliation.ReconcileRoleOptions{Role: reconciliation.ClusterRoleRuleOwner{ClusterRole: &r},
			Client: reconciliation.ClusterRoleModifier{Client: rbac.ClusterRoles()}, Confirm: true})
	}
	for _, namespaced := range bootstrappolicy.NamespaceRoles() {
		for _, r := range namespaced {
			roles = append(roles, reconciliation.ReconcileRoleOptions{Role: reconciliation.RoleRuleOwner{Role: &r},
				Client: reconciliation.RoleModifier{Client: rbac, NamespaceClient: client.CoreV1().Namespaces()}, Confirm: true})
		}
	}
	var bindings []reconciliation.ReconcileRoleBindingOptions
	for _, b := range append(append(bootstrappolicy.ClusterRoleBindings(), bootstrappolicy.ControllerRoleBindings()...), skiffClusterRoleBindings...) {
		bindings = append(bindings, reconciliation.ReconcileRoleBindingOptions{RoleBinding: reconciliation.ClusterRoleBindingAdapter{ClusterRoleBinding: &b},
			Client: reconciliation.ClusterRoleBindingClientAdapter{Client: rbac.ClusterRoleBindings()}, Confirm: true})
	}
	// NamespaceRoleBindings returns the library's own map: copy it before adding Skiff's.
	namespacedBindings := map[string][]rbacv1.RoleBinding{}
	for ns, bindings := range bootstrappolicy.NamespaceRoleBindings() {
		namespacedBindings[ns] = slices.Clone(bindings)
	}
	for _, b := range skiffRoleBindings {
		namespacedBindings[b.Namespace] = append(namespacedBindings[b.Namespace], b)
	}
	for _, namespaced := range namespacedBindings {
		for _, b := range namespaced {
			bindings = append(bindings, reconciliation.ReconcileRoleBindingOptions{RoleBinding: reconciliation.RoleBindingAdapter{RoleBinding: &b},
				Client: reconciliation.RoleBindingClientAdapter{Client: rbac, NamespaceClient: client.CoreV1().Namespaces()}, Confirm: true})
		}
	}
	retriable := func(err error) bool { return apierrors.IsConflict(err) || apierrors.IsServiceUnavailable(err) }
	for _, r := range roles {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := retry.OnError(retry.DefaultBackoff, retriable, func() error { _, err := r.Run(); return err }); err != nil {
			return fmt.Errorf("role %s/%s: %w", r.Role.GetNamespace(), r.Role.GetName(), err)
		}
	}
	for _, b := range bindings {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err := retry.OnError(retry.DefaultBackoff, retriable, func() error { _, err := b.Run(); return err }); err != nil {
			return fmt.Errorf("binding %s/%s: %w", b.RoleBinding.GetNamespace(), b.RoleBinding.GetName(), err)
		}
	}
	return nil
}
