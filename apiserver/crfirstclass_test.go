package apiserver_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/internal/servertest"
)

// TestCustomResourcesFirstClass: custom resources take part where the built-in kinds do, on a whole server
// with its controllers: a ResourceQuota's count/<resource>.<group>, a ValidatingAdmissionPolicy matching the
// custom resource, the aggregated ClusterRoles (edit picks up a ClusterRole labelled for it), garbage
// collection through ownerReferences both ways between custom and built-in objects, and namespace deletion.
func TestCustomResourcesFirstClass(t *testing.T) {
	t.Parallel()
	peer := servertest.Shared(t)
	ns := servertest.Namespace(t, peer, "crfirst")
	ctx := context.Background()
	client := peer.Client
	crds := apiextensionsclient.NewForConfigOrDie(peer.Config).ApiextensionsV1().CustomResourceDefinitions()
	if _, err := crds.Create(ctx, crontabCRD(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	gvr := schema.GroupVersionResource{Group: "stable.example.com", Version: "v1", Resource: "crontabs"}
	dyn := dynamic.NewForConfigOrDie(peer.Config)
	crontab := func(name, image string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "stable.example.com/v1", "kind": "CronTab",
			"metadata": map[string]any{"name": name}, "spec": map[string]any{"cronSpec": "* * * * *", "image": image}}}
	}
	namespace := func(t *testing.T, name string) {
		t.Helper()
		if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	proctest.WaitFor(t, "crontabs served", 30*time.Second, func() error {
		_, err := dyn.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{})
		return err
	})

	t.Run("quota count", func(t *testing.T) {
		t.Parallel()
		namespace(t, "quota")
		if _, err := client.CoreV1().ResourceQuotas("quota").Create(ctx, &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "q"},
			Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"count/crontabs.stable.example.com": resource.MustParse("0")}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		// Admission refuses to charge a quota until the quota controller has counted its resources. The
		// controller finds a new CRD's resource by discovery (every 30 s, kube-controller-manager's period) and
		// counts it at the quota's next sync, which a change of spec.hard brings: the conformance suite's
		// "capture the life of a custom resource" changes it until the usage appears, since kube-apiserver is
		// the same.
		quotas := client.CoreV1().ResourceQuotas("quota")
		proctest.WaitFor(t, "the quota to count crontabs", 90*time.Second, func() error {
			rq, err := quotas.Get(ctx, "q", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if _, counted := rq.Status.Used["count/crontabs.stable.example.com"]; counted {
				return nil
			}
			hard := rq.Spec.Hard["count/crontabs.stable.example.com"]
			hard.Add(resource.MustParse("1"))
			rq.Spec.Hard["count/crontabs.stable.example.com"] = hard
			if _, err := quotas.Update(ctx, rq, metav1.UpdateOptions{}); err != nil {
				return err
			}
			time.Sleep(2 * time.Second)
			return fmt.Errorf("status %v", rq.Status)
		})
		proctest.WaitFor(t, "the quota's hard limit back at 2", 30*time.Second, func() error {
			rq, err := quotas.Get(ctx, "q", metav1.GetOptions{})
			if err != nil {
				return err
			}
			spec, hard := rq.Spec.Hard["count/crontabs.stable.example.com"], rq.Status.Hard["count/crontabs.stable.example.com"]
			if spec.Value() == 2 && hard.Value() == 2 {
				return nil
			}
			rq.Spec.Hard["count/crontabs.stable.example.com"] = resource.MustParse("2")
			_, err = quotas.Update(ctx, rq, metav1.UpdateOptions{})
			return fmt.Errorf("status %v: %v", rq.Status.Hard, err)
		})
		crontabs := dyn.Resource(gvr).Namespace("quota")
		for i := 0; i < 2; i++ {
			if _, err := crontabs.Create(ctx, crontab(fmt.Sprintf("c%d", i), "backup:1"), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		_, err := crontabs.Create(ctx, crontab("c2", "backup:1"), metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "exceeded quota") || !strings.Contains(err.Error(), "count/crontabs.stable.example.com") {
			t.Fatalf("third crontab: %v; want 403 exceeded quota naming count/crontabs.stable.example.com", err)
		}
		proctest.WaitFor(t, "the quota's usage", 30*time.Second, func() error {
			rq, err := quotas.Get(ctx, "q", metav1.GetOptions{})
			if used := rq.Status.Used["count/crontabs.stable.example.com"]; err != nil || used.Value() != 2 {
				return fmt.Errorf("used %v %v", rq.Status.Used, err)
			}
			return nil
		})
	})

	t.Run("ValidatingAdmissionPolicy", func(t *testing.T) {
		t.Parallel()
		namespace(t, "vap")
		policies := client.AdmissionregistrationV1()
		if _, err := policies.ValidatingAdmissionPolicies().Create(ctx, &admissionregistrationv1.ValidatingAdmissionPolicy{
			ObjectMeta: metav1.ObjectMeta{Name: "crontab-registry"},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
				MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionregistrationv1.RuleWithOperations{
						Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
						Rule:       admissionregistrationv1.Rule{APIGroups: []string{"stable.example.com"}, APIVersions: []string{"v1"}, Resources: []string{"crontabs"}},
					}}}},
				Validations: []admissionregistrationv1.Validation{{
					Expression: `object.spec.image.startsWith("registry.example/")`, Message: "crontab images come from registry.example"}},
			},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := policies.ValidatingAdmissionPolicyBindings().Create(ctx, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "crontab-registry"},
			Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: "crontab-registry",
				ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
				MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
					MatchLabels: map[string]string{"kubernetes.io/metadata.name": "vap"}}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		crontabs := dyn.Resource(gvr).Namespace("vap")
		// The policy takes effect once every server's policy informer has it.
		proctest.WaitFor(t, "the policy to deny", 30*time.Second, func() error {
			_, err := crontabs.Create(ctx, crontab("elsewhere", "docker.io/backup:1"), metav1.CreateOptions{})
			if err == nil {
				_ = crontabs.Delete(ctx, "elsewhere", metav1.DeleteOptions{})
				return fmt.Errorf("admitted")
			}
			if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "crontab images come from registry.example") {
				t.Fatalf("denied with %v; want 422 with the policy's message", err)
			}
			return nil
		})
		if _, err := crontabs.Create(ctx, crontab("ours", "registry.example/backup:1"), metav1.CreateOptions{}); err != nil {
			t.Fatalf("an allowed crontab: %v", err)
		}
		// Outside the binding's namespace the policy does not apply.
		if _, err := dyn.Resource(gvr).Namespace(ns).Create(ctx, crontab("unbound", "docker.io/backup:1"), metav1.CreateOptions{}); err != nil {
			t.Fatalf("a crontab outside the binding: %v", err)
		}
	})

	t.Run("aggregated ClusterRoles", func(t *testing.T) {
		t.Parallel()
		if _, err := client.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: "crontab-editor", Labels: map[string]string{"rbac.authorization.k8s.io/aggregate-to-edit": "true"}},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"stable.example.com"}, Resources: []string{"crontabs"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := client.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "alice-edit"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "alice"}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		proctest.WaitFor(t, "edit to allow alice to create crontabs", 30*time.Second, func() error {
			review, err := client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User: "alice", ResourceAttributes: &authorizationv1.ResourceAttributes{
					Namespace: ns, Verb: "create", Group: "stable.example.com", Resource: "crontabs"}}}, metav1.CreateOptions{})
			if err != nil {
				return err
			}
			if !review.Status.Allowed {
				return fmt.Errorf("not allowed: %s", review.Status.Reason)
			}
			return nil
		})
	})

	t.Run("garbage collection", func(t *testing.T) {
		t.Parallel()
		crontabs := dyn.Resource(gvr).Namespace(ns)
		owner, err := crontabs.Create(ctx, crontab("owner", "backup:1"), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// A ConfigMap owned by a custom resource, and a custom resource owned by a ConfigMap.
		if _, err := client.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "owned",
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "stable.example.com/v1", Kind: "CronTab", Name: "owner", UID: owner.GetUID()}}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		cm, err := client.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "parent"}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		child := crontab("child", "backup:1")
		child.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "v1", Kind: "ConfigMap", Name: "parent", UID: cm.UID}})
		if _, err := crontabs.Create(ctx, child, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := crontabs.Delete(ctx, "owner", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := client.CoreV1().ConfigMaps(ns).Delete(ctx, "parent", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		proctest.WaitFor(t, "the dependents collected", 60*time.Second, func() error {
			if _, err := client.CoreV1().ConfigMaps(ns).Get(ctx, "owned", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("the ConfigMap owned by a CronTab: %v", err)
			}
			if _, err := crontabs.Get(ctx, "child", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("the CronTab owned by a ConfigMap: %v", err)
			}
			return nil
		})
	})

	t.Run("namespace deletion", func(t *testing.T) {
		t.Parallel()
		namespace(t, "doomed")
		if _, err := dyn.Resource(gvr).Namespace("doomed").Create(ctx, crontab("gone", "backup:1"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := client.CoreV1().Namespaces().Delete(ctx, "doomed", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		proctest.WaitFor(t, "the namespace gone with its crontab", 60*time.Second, func() error {
			if _, err := client.CoreV1().Namespaces().Get(ctx, "doomed", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("namespace: %v", err)
			}
			return nil
		})
		if _, err := crds.Get(ctx, "crontabs.stable.example.com", metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
		list, err := dyn.Resource(gvr).Namespace("doomed").List(ctx, metav1.ListOptions{})
		if err != nil || len(list.Items) != 0 {
			t.Fatalf("crontabs of the deleted namespace: %v %v", list, err)
		}
	})
}
