package apiserver_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/skiff-dev/skiff/apiserver"
)

// TestConfigMapSecretPriorityClassRules: ConfigMaps, Secrets and PriorityClasses follow kube-apiserver's
// registry rules (its strategies run on them): an immutable ConfigMap's or Secret's data and flag never
// change, a Secret key may not be empty, stringData is still folded into data, and a PriorityClass's value
// never changes and "system-" names are reserved. Each refusal is a 422 naming the field.
func TestConfigMapSecretPriorityClassRules(t *testing.T) {
	t.Parallel()
	cfg := apiserver.SharedTestAPI(t)
	ns := apiserver.NamespaceOn(t, cfg, "core")
	client := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()
	invalid := func(what string, err error, wants ...string) {
		t.Helper()
		if !apierrors.IsInvalid(err) {
			t.Errorf("%s: %v; want 422 Invalid", what, err)
			return
		}
		for _, w := range wants {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v; want it to name %q", what, err, w)
			}
		}
	}
	yes := true

	cms := client.CoreV1().ConfigMaps(ns)
	cm, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "frozen"}, Data: map[string]string{"k": "v"}, Immutable: &yes}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	changed := cm.DeepCopy()
	changed.Data["k"] = "w"
	_, err = cms.Update(ctx, changed, metav1.UpdateOptions{})
	invalid("changing an immutable ConfigMap's data", err, "data", "field is immutable when `immutable` is set")
	thawed := cm.DeepCopy()
	thawed.Immutable = nil
	_, err = cms.Update(ctx, thawed, metav1.UpdateOptions{})
	invalid("unsetting immutable", err, "immutable", "field is immutable when `immutable` is set")
	labelled := cm.DeepCopy()
	labelled.Labels = map[string]string{"a": "b"}
	if _, err := cms.Update(ctx, labelled, metav1.UpdateOptions{}); err != nil {
		t.Errorf("labelling an immutable ConfigMap: %v", err)
	}

	secrets := client.CoreV1().Secrets(ns)
	_, err = secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "emptykey"}, Data: map[string][]byte{"": []byte("x")}}, metav1.CreateOptions{})
	invalid("an empty Secret key", err, "data[]", "a valid config key must consist of alphanumeric characters")
	s, err := secrets.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "frozen"}, StringData: map[string]string{"password": "p"}, Immutable: &yes}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if string(s.Data["password"]) != "p" || len(s.StringData) != 0 || s.Type != corev1.SecretTypeOpaque {
		t.Errorf("stored Secret: data %q stringData %v type %q; want stringData folded into data, type Opaque", s.Data, s.StringData, s.Type)
	}
	s.Data["password"] = []byte("q")
	_, err = secrets.Update(ctx, s, metav1.UpdateOptions{})
	invalid("changing an immutable Secret's data", err, "data", "field is immutable when `immutable` is set")

	pcs := client.SchedulingV1().PriorityClasses()
	pc, err := pcs.Create(ctx, &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "batch"}, Value: 100}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pc.Value = 200
	_, err = pcs.Update(ctx, pc, metav1.UpdateOptions{})
	invalid("changing a PriorityClass's value", err, "value", "may not be changed in an update")
	_, err = pcs.Create(ctx, &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "system-mine"}, Value: 100}, metav1.CreateOptions{})
	invalid("a system- PriorityClass", err, "metadata.name", "reserved for system use")
	// The built-in classes exist, created by a post-start hook as kube-apiserver creates them.
	waitFor(t, "system-node-critical", 10*time.Second, func() error {
		pc, err := pcs.Get(ctx, "system-node-critical", metav1.GetOptions{})
		if err == nil && pc.Value != 2000001000 {
			t.Fatalf("system-node-critical's value %d", pc.Value)
		}
		return err
	})
}

// TestPodTemplates: core/v1 PodTemplates are served as on kube-apiserver (the conformance suite's PodTemplate
// lifecycle): create, patch, list by label, delete a collection, and a template that is not a valid pod's
// refused with the field named.
func TestPodTemplates(t *testing.T) {
	t.Parallel()
	cfg := apiserver.SharedTestAPI(t)
	ns := apiserver.NamespaceOn(t, cfg, "podtemplates")
	client := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()
	templates := client.CoreV1().PodTemplates(ns)
	template := func(name, image string) *corev1.PodTemplate {
		return &corev1.PodTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"set": "a"}},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": name}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: image}}}}}
	}
	for _, name := range []string{"one", "two", "three"} {
		if _, err := templates.Create(ctx, template(name, "busybox"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := templates.Create(ctx, template("noimage", ""), metav1.CreateOptions{})
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "template.spec.containers[0].image") {
		t.Errorf("a template without an image: %v; want 422 naming template.spec.containers[0].image", err)
	}
	patched, err := templates.Patch(ctx, "one", types.MergePatchType, []byte(`{"metadata":{"labels":{"patched":"true"}}}`), metav1.PatchOptions{})
	if err != nil || patched.Labels["patched"] != "true" {
		t.Fatalf("patch: %v %v", patched, err)
	}
	if list, err := templates.List(ctx, metav1.ListOptions{LabelSelector: "patched=true"}); err != nil || len(list.Items) != 1 {
		t.Fatalf("list by label: %v %v", list, err)
	}
	if err := templates.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "set=a"}); err != nil {
		t.Fatal(err)
	}
	if list, err := templates.List(ctx, metav1.ListOptions{}); err != nil || len(list.Items) != 0 {
		t.Fatalf("after the collection's delete: %v %v", list, err)
	}
}
