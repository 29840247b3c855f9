package apiserver_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/skiff-dev/skiff/apiserver"
	"github.com/skiff-dev/skiff/internal/proctest"
)

// TestMutatingAdmissionPolicy: admissionregistration.k8s.io/v1 MutatingAdmissionPolicies and their bindings
// are served with kube's validation (a CEL expression that does not compile is refused, naming the field; a
// binding's policy must exist for its paramRef checks) and enforced by the library's plugin: a ConfigMap
// created in the binding's namespaces gets the label the policy applies, others do not.
func TestMutatingAdmissionPolicy(t *testing.T) {
	t.Parallel()
	cs := kubernetes.NewForConfigOrDie(apiserver.StartTestAPI(t, apiserver.TestAPIOptions{}))
	ctx := context.Background()
	policies := cs.AdmissionregistrationV1()

	bad := &admissionregistrationv1.MutatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "bad"},
		Spec: admissionregistrationv1.MutatingAdmissionPolicySpec{
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{Operations: []admissionregistrationv1.OperationType{"CREATE"},
					Rule: admissionregistrationv1.Rule{APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"configmaps"}}}}}},
			Mutations: []admissionregistrationv1.Mutation{{PatchType: admissionregistrationv1.PatchTypeApplyConfiguration,
				ApplyConfiguration: &admissionregistrationv1.ApplyConfiguration{Expression: "Object{metadata: "}}},
			ReinvocationPolicy: admissionregistrationv1.NeverReinvocationPolicy,
		},
	}
	_, err := policies.MutatingAdmissionPolicies().Create(ctx, bad, metav1.CreateOptions{})
	if !apierrors.IsInvalid(err) {
		t.Fatalf("a policy whose expression does not compile: %v; want 422", err)
	}
	if causes := err.(apierrors.APIStatus).Status().Details.Causes; len(causes) == 0 || causes[0].Field != "spec.mutations[0].applyConfiguration.expression" {
		t.Errorf("causes %+v; want the expression's field", causes)
	}

	good := bad.DeepCopy()
	good.Name = "label-configmaps"
	good.Spec.Mutations[0].ApplyConfiguration.Expression = `Object{metadata: Object.metadata{labels: {"mutated": "yes"}}}`
	if _, err := policies.MutatingAdmissionPolicies().Create(ctx, good, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := policies.MutatingAdmissionPolicyBindings().Create(ctx, &admissionregistrationv1.MutatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "label-configmaps"},
		Spec: admissionregistrationv1.MutatingAdmissionPolicyBindingSpec{PolicyName: good.Name,
			MatchResources: &admissionregistrationv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{
				MatchLabels: map[string]string{"kubernetes.io/metadata.name": "mutated"}}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"mutated", "untouched"} {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	proctest.WaitFor(t, "the policy to label ConfigMaps", 30*time.Second, func() error {
		n++
		cm, err := cs.CoreV1().ConfigMaps("mutated").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%d", n)}}, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		if cm.Labels["mutated"] != "yes" {
			return fmt.Errorf("labels %v", cm.Labels)
		}
		return nil
	})
	cm, err := cs.CoreV1().ConfigMaps("untouched").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := cm.Labels["mutated"]; ok {
		t.Errorf("a ConfigMap outside the binding's namespaces was mutated: %v", cm.Labels)
	}
	if cols, rows := tableColumns(t, policies.RESTClient(), "mutatingadmissionpolicies"); !strings.HasPrefix(cols, "Name,") || rows != 1 {
		t.Errorf("mutatingadmissionpolicies table: %s, %d rows", cols, rows)
	}
}
