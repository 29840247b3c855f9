package apiserver_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/skiff-dev/skiff/apiserver"
	"github.com/skiff-dev/skiff/internal/proctest"
)

// TestDynamicResourceAllocationAPI: resource.k8s.io/v1 is served as kube-apiserver 1.37 serves it by default,
// the five kinds of the DRA conformance tests (test/e2e/dra/dra.go, "CRUD Tests"), with kube's validation
// (field paths), status only through /status, ResourceSlice field selectors, and kube's table columns.
func TestDynamicResourceAllocationAPI(t *testing.T) {
	t.Parallel()
	config := apiserver.StartTestAPI(t, apiserver.TestAPIOptions{})
	cs := kubernetes.NewForConfigOrDie(config)
	ctx := context.Background()
	rv1 := cs.ResourceV1()

	resources, err := cs.Discovery().ServerResourcesForGroupVersion("resource.k8s.io/v1")
	if err != nil {
		t.Fatal(err)
	}
	served := map[string]bool{}
	for _, r := range resources.APIResources {
		served[r.Name] = true
	}
	for _, name := range []string{"deviceclasses", "devicetaintrules", "devicetaintrules/status", "resourceclaims",
		"resourceclaims/status", "resourceclaimtemplates", "resourceslices"} {
		if !served[name] {
			t.Errorf("discovery of resource.k8s.io/v1 lacks %s: %v", name, served)
		}
	}

	t.Run("DeviceClass", func(t *testing.T) {
		dc := &resourcev1.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "dra.example.com"},
			Spec: resourcev1.DeviceClassSpec{Selectors: []resourcev1.DeviceSelector{{CEL: &resourcev1.CELDeviceSelector{Expression: "1 +"}}}}}
		_, err := rv1.DeviceClasses().Create(ctx, dc, metav1.CreateOptions{})
		wantInvalidField(t, err, "spec.selectors[0].cel.expression")
		dc.Spec.Selectors[0].CEL.Expression = "false"
		created, err := rv1.DeviceClasses().Create(ctx, dc, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		created.Spec.Selectors[0].CEL.Expression = "1 == 0"
		if _, err := rv1.DeviceClasses().Update(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		got, err := rv1.DeviceClasses().Get(ctx, dc.Name, metav1.GetOptions{})
		if err != nil || got.Spec.Selectors[0].CEL.Expression != "1 == 0" {
			t.Fatalf("after update: %+v, %v", got, err)
		}
		if err := rv1.DeviceClasses().Delete(ctx, dc.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("ResourceClaim", func(t *testing.T) {
		ns := createDRANamespace(t, cs, "dra-claims")
		claims := rv1.ResourceClaims(ns)
		claim := &resourcev1.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "claim"},
			Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
				Name: "Req_0", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "dra.example.com"}}}}}}
		_, err := claims.Create(ctx, claim, metav1.CreateOptions{})
		wantInvalidField(t, err, "spec.devices.requests[0].name")

		// Admin access to devices needs the namespace's label, read through the loopback client.
		claim.Spec.Devices.Requests[0].Name = "req-0"
		claim.Spec.Devices.Requests[0].Exactly.AdminAccess = ptr(true)
		_, err = claims.Create(ctx, claim, metav1.CreateOptions{})
		wantInvalidField(t, err, "spec.devices.requests[0].adminAccess") // kube's path, without .exactly
		claim.Spec.Devices.Requests[0].Exactly.AdminAccess = nil

		claim.Status.Allocation = &resourcev1.AllocationResult{}
		created, err := claims.Create(ctx, claim, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if created.Status.Allocation != nil {
			t.Errorf("status set on create: %+v", created.Status)
		}
		if got := created.Spec.Devices.Requests[0].Exactly; got.AllocationMode != resourcev1.DeviceAllocationModeExactCount || got.Count != 1 {
			t.Errorf("kube's defaults not applied: %+v", got)
		}

		// The spec is immutable; labels change, and the main endpoint ignores the status.
		changed := created.DeepCopy()
		changed.Spec.Devices.Requests[0].Name = "req-1"
		_, err = claims.Update(ctx, changed, metav1.UpdateOptions{})
		wantInvalidField(t, err, "spec")
		created.Labels = map[string]string{"test.dra.example.com": "test"}
		created.Status.Allocation = &resourcev1.AllocationResult{}
		updated, err := claims.Update(ctx, created, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if updated.Labels["test.dra.example.com"] != "test" || updated.Status.Allocation != nil {
			t.Errorf("after update: labels %v, status %+v; want the label and no allocation", updated.Labels, updated.Status)
		}

		// Status through /status, by update and by server-side apply.
		updated.Status.Allocation = &resourcev1.AllocationResult{}
		allocated, err := claims.UpdateStatus(ctx, updated, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if allocated.Status.Allocation == nil {
			t.Errorf("status after /status: %+v", allocated.Status)
		}
		allocated.Status.Allocation = nil
		if _, err := claims.UpdateStatus(ctx, allocated, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		applied, err := claims.Patch(ctx, "claim", types.ApplyPatchType,
			[]byte(`{"apiVersion":"resource.k8s.io/v1","kind":"ResourceClaim","metadata":{"name":"claim"},"status":{"allocation":{}}}`),
			metav1.PatchOptions{FieldManager: "e2e"}, "status")
		if err != nil {
			t.Fatal(err)
		}
		if applied.Status.Allocation == nil {
			t.Errorf("status after an apply to /status: %+v", applied.Status)
		}

		// kube's claim store answers a delete with the claim.
		deleted, err := cs.ResourceV1().RESTClient().Delete().Namespace(ns).Resource("resourceclaims").Name("claim").DoRaw(ctx)
		if err != nil || !strings.Contains(string(deleted), `"kind":"ResourceClaim"`) {
			t.Errorf("delete answered %s, %v; want the claim", deleted, err)
		}
		if _, err := claims.Create(ctx, claim, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		claim.Name = "claim-2"
		claim.Labels = map[string]string{"test.dra.example.com": "test"}
		if _, err := claims.Create(ctx, claim, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := claims.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: "test.dra.example.com=test"}); err != nil {
			t.Fatal(err)
		}
		if list, err := claims.List(ctx, metav1.ListOptions{}); err != nil || len(list.Items) != 1 || list.Items[0].Name != "claim" {
			t.Errorf("after deletecollection of the labelled claim: %v, %v; want the unlabelled one", list, err)
		}
	})

	t.Run("ResourceClaimTemplate", func(t *testing.T) {
		ns := createDRANamespace(t, cs, "dra-templates")
		templates := rv1.ResourceClaimTemplates(ns)
		tmpl := &resourcev1.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "template"},
			Spec: resourcev1.ResourceClaimTemplateSpec{Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{
				Requests: []resourcev1.DeviceRequest{{Name: "req-0", Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: "dra.example.com"}}}}}}}
		created, err := templates.Create(ctx, tmpl, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		created.Spec.Spec.Devices.Requests[0].Name = "req-1"
		_, err = templates.Update(ctx, created, metav1.UpdateOptions{})
		wantInvalidField(t, err, "spec")
		if _, err := templates.Patch(ctx, "template", types.StrategicMergePatchType,
			[]byte(`{"metadata": {"labels": {"test.dra.example.com": "test"}}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := templates.Delete(ctx, "template", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("ResourceSlice", func(t *testing.T) {
		slices := rv1.ResourceSlices()
		for _, node := range []string{"node-a", "node-b"} {
			s := &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "slice-" + node},
				Spec: resourcev1.ResourceSliceSpec{Driver: "dra.example.com", NodeName: ptr(node),
					Pool: resourcev1.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1}}}
			if _, err := slices.Create(ctx, s, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		bad := &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "no-owner"},
			Spec: resourcev1.ResourceSliceSpec{Driver: "dra.example.com", Pool: resourcev1.ResourcePool{Name: "p", ResourceSliceCount: 1}}}
		_, err := slices.Create(ctx, bad, metav1.CreateOptions{})
		wantInvalidField(t, err, "spec")

		list, err := slices.List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=node-b,spec.driver=dra.example.com"})
		if err != nil {
			t.Fatal(err)
		}
		if len(list.Items) != 1 || list.Items[0].Name != "slice-node-b" {
			t.Errorf("spec.nodeName=node-b: %d items", len(list.Items))
		}
		if _, err := slices.List(ctx, metav1.ListOptions{FieldSelector: "spec.devices=x"}); !apierrors.IsBadRequest(err) {
			t.Errorf("an unsupported field selector: %v; want 400", err)
		}
		patched, err := slices.Patch(ctx, "slice-node-a", types.StrategicMergePatchType,
			[]byte(`{"spec": {"devices": [{"name": "device-0"}]}}`), metav1.PatchOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(patched.Spec.Devices) != 1 {
			t.Errorf("devices after patch: %+v", patched.Spec.Devices)
		}

		// kube-apiserver's columns: Node, Driver, Pool.
		table, err := rv1.RESTClient().Get().Resource("resourceslices").
			SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").DoRaw(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, col := range []string{`"name":"Node"`, `"name":"Driver"`, `"name":"Pool"`, `"node-a"`} {
			if !strings.Contains(string(table), col) {
				t.Errorf("table lacks %s: %s", col, table)
			}
		}
		if err := slices.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			t.Fatal(err)
		}
	})

	// A node's DRA drivers write the slices of their node only: NodeRestriction on create and delete, the
	// Node authorizer (its graph of slices) on the other verbs, and lists scoped to the node.
	t.Run("ResourceSlice of a node", func(t *testing.T) {
		nodeConfig := rest.CopyConfig(config)
		nodeConfig.Impersonate = rest.ImpersonationConfig{UserName: "system:node:n1", Groups: []string{"system:nodes", "system:authenticated"}}
		asNode := kubernetes.NewForConfigOrDie(nodeConfig).ResourceV1().ResourceSlices()
		slice := func(name, node string) *resourcev1.ResourceSlice {
			return &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: resourcev1.ResourceSliceSpec{Driver: "dra.example.com", NodeName: ptr(node),
					Pool: resourcev1.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1}}}
		}
		if _, err := asNode.Create(ctx, slice("n1-slice", "n1"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := asNode.Create(ctx, slice("n2-by-n1", "n2"), metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("node n1 creating a slice of n2: %v; want 403", err)
		}
		if _, err := rv1.ResourceSlices().Create(ctx, slice("n2-slice", "n2"), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		proctest.WaitFor(t, "node n1 reading its slice", 30*time.Second, func() error {
			_, err := asNode.Get(ctx, "n1-slice", metav1.GetOptions{})
			return err
		})
		if _, err := asNode.Get(ctx, "n2-slice", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("node n1 reading a slice of n2: %v; want 403", err)
		}
		if _, err := asNode.List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("node n1 listing all slices: %v; want 403", err)
		}
		if list, err := asNode.List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=n1"}); err != nil || len(list.Items) != 1 {
			t.Errorf("node n1 listing its slices: %v, %v", list, err)
		}
		if err := asNode.Delete(ctx, "n1-slice", metav1.DeleteOptions{}); err != nil {
			t.Error(err)
		}
		if err := rv1.ResourceSlices().Delete(ctx, "n2-slice", metav1.DeleteOptions{}); err != nil {
			t.Error(err)
		}
	})

	t.Run("DeviceTaintRule", func(t *testing.T) {
		rules := rv1.DeviceTaintRules()
		rule := &resourcev1.DeviceTaintRule{ObjectMeta: metav1.ObjectMeta{Name: "rule"},
			Spec: resourcev1.DeviceTaintRuleSpec{Taint: resourcev1.DeviceTaint{Key: "testing", Effect: "Sometimes"}}}
		_, err := rules.Create(ctx, rule, metav1.CreateOptions{})
		wantInvalidField(t, err, "spec.taint.effect")
		rule.Spec.Taint.Effect = resourcev1.DeviceTaintEffectNone
		created, err := rules.Create(ctx, rule, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		created.Spec.Taint.Effect = resourcev1.DeviceTaintEffectNoExecute
		condition := metav1.Condition{Type: "Testing", Status: metav1.ConditionTrue, LastTransitionTime: metav1.Now(),
			Reason: "E2E_test_running", Message: "This condition can be ignored."}
		created.Status.Conditions = []metav1.Condition{condition}
		updated, err := rules.Update(ctx, created, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if updated.Spec.Taint.Effect != resourcev1.DeviceTaintEffectNoExecute || len(updated.Status.Conditions) != 0 {
			t.Errorf("after update: effect %s, conditions %+v; want NoExecute and none", updated.Spec.Taint.Effect, updated.Status.Conditions)
		}
		updated.Status.Conditions = []metav1.Condition{condition}
		withStatus, err := rules.UpdateStatus(ctx, updated, metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(withStatus.Status.Conditions) != 1 {
			t.Errorf("conditions after /status: %+v", withStatus.Status.Conditions)
		}
		if err := rules.Delete(ctx, "rule", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := rules.Get(ctx, "rule", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("after delete: %v", err)
		}
	})
}

// wantInvalid fails unless err is a 422 whose first cause names field.
func wantInvalidField(t *testing.T, err error, field string) {
	t.Helper()
	if !apierrors.IsInvalid(err) {
		t.Fatalf("%v; want 422 naming %s", err, field)
	}
	causes := err.(apierrors.APIStatus).Status().Details.Causes
	if len(causes) == 0 || causes[0].Field != field {
		t.Errorf("causes %+v; want %s", causes, field)
	}
}

func createDRANamespace(t *testing.T, cs kubernetes.Interface, name string) string {
	t.Helper()
	if _, err := cs.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return name
}
