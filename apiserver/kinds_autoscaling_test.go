package apiserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	autoscalingv1 "k8s.io/api/autoscaling/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/skiff-dev/skiff/apiserver"
)

// TestHorizontalPodAutoscalers: HorizontalPodAutoscalers are served in autoscaling/v2 and autoscaling/v1 as by
// kube-apiserver: one object read in either version, what v1 cannot hold kept in its annotations so that a
// v1 read-modify-write loses none of the v2 spec, refused with a field path when invalid, the status changed
// only through /status, kubectl's table with kube's columns, and both versions in discovery (legacy and
// aggregated) with v2 preferred.
func TestHorizontalPodAutoscalers(t *testing.T) {
	t.Parallel()
	cfg := apiserver.SharedTestAPI(t)
	ns := apiserver.NamespaceOn(t, cfg, "hpa")
	c := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()
	v1, v2 := c.AutoscalingV1().HorizontalPodAutoscalers(ns), c.AutoscalingV2().HorizontalPodAutoscalers(ns)

	hpa := &autoscalingv2.HorizontalPodAutoscaler{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "web"},
			MinReplicas:    ptr[int32](2), MaxReplicas: 5,
			Metrics: []autoscalingv2.MetricSpec{
				{Type: autoscalingv2.ResourceMetricSourceType, Resource: &autoscalingv2.ResourceMetricSource{Name: corev1.ResourceCPU,
					Target: autoscalingv2.MetricTarget{Type: autoscalingv2.UtilizationMetricType, AverageUtilization: ptr[int32](50)}}},
				{Type: autoscalingv2.ResourceMetricSourceType, Resource: &autoscalingv2.ResourceMetricSource{Name: corev1.ResourceMemory,
					Target: autoscalingv2.MetricTarget{Type: autoscalingv2.AverageValueMetricType, AverageValue: ptr(resource.MustParse("100Mi"))}}},
			},
			Behavior: &autoscalingv2.HorizontalPodAutoscalerBehavior{ScaleDown: &autoscalingv2.HPAScalingRules{StabilizationWindowSeconds: ptr[int32](60)}},
		},
		Status: autoscalingv2.HorizontalPodAutoscalerStatus{CurrentReplicas: 7},
	}
	created, err := v2.Create(ctx, hpa, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if created.Status.CurrentReplicas != 0 {
		t.Error("a create set the status")
	}
	// kube's v2 defaults: the behavior's other rules.
	if b := created.Spec.Behavior; b.ScaleUp == nil || b.ScaleDown.SelectPolicy == nil || *b.ScaleDown.StabilizationWindowSeconds != 60 {
		t.Errorf("behavior not defaulted as kube does: %+v", b)
	}
	if created.Generation != 1 {
		t.Errorf("generation %d at create; want 1 (HPAGeneration)", created.Generation)
	}

	// Read through v1: CPU utilization in its own field, the rest in annotations.
	old, err := v1.Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if old.Spec.TargetCPUUtilizationPercentage == nil || *old.Spec.TargetCPUUtilizationPercentage != 50 || old.Spec.MaxReplicas != 5 ||
		old.Spec.ScaleTargetRef.Kind != "Deployment" || *old.Spec.MinReplicas != 2 {
		t.Errorf("v1 spec %+v", old.Spec)
	}
	for _, a := range []string{"autoscaling.alpha.kubernetes.io/metrics", "autoscaling.alpha.kubernetes.io/behavior"} {
		if old.Annotations[a] == "" {
			t.Errorf("v1 object without annotation %s: %v", a, old.Annotations)
		}
	}
	if !strings.Contains(old.Annotations["autoscaling.alpha.kubernetes.io/metrics"], "memory") {
		t.Errorf("the memory metric is not in v1's metrics annotation: %s", old.Annotations["autoscaling.alpha.kubernetes.io/metrics"])
	}
	// A v1 read-modify-write keeps the v2-only fields.
	old.Spec.MaxReplicas = 6
	if _, err := v1.Update(ctx, old, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	now, err := v2.Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// kube's v1 conversion puts the metrics of the annotation first and the CPU utilization last.
	if now.Spec.MaxReplicas != 6 || len(now.Spec.Metrics) != 2 || now.Spec.Metrics[0].Resource.Name != corev1.ResourceMemory ||
		now.Spec.Metrics[1].Resource.Name != corev1.ResourceCPU || *now.Spec.Metrics[1].Resource.Target.AverageUtilization != 50 ||
		now.Spec.Behavior == nil || *now.Spec.Behavior.ScaleDown.StabilizationWindowSeconds != 60 {
		t.Errorf("after a v1 update, v2 spec %+v", now.Spec)
	}
	for a := range now.Annotations {
		if strings.HasPrefix(a, "autoscaling.alpha.kubernetes.io/") {
			t.Errorf("v2 object carries v1's round-trip annotation %s", a)
		}
	}
	if now.Generation != 2 {
		t.Errorf("generation %d after a spec change; want 2", now.Generation)
	}

	// A v1 create is read through v2 as one CPU utilization metric.
	if _, err := v1.Create(ctx, &autoscalingv1.HorizontalPodAutoscaler{ObjectMeta: metav1.ObjectMeta{Name: "rc"},
		Spec: autoscalingv1.HorizontalPodAutoscalerSpec{ScaleTargetRef: autoscalingv1.CrossVersionObjectReference{Kind: "ReplicationController", Name: "rc"},
			MaxReplicas: 3, TargetCPUUtilizationPercentage: ptr[int32](70)}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if got, err := v2.Get(ctx, "rc", metav1.GetOptions{}); err != nil || len(got.Spec.Metrics) != 1 ||
		got.Spec.Metrics[0].Resource.Target.AverageUtilization == nil || *got.Spec.Metrics[0].Resource.Target.AverageUtilization != 70 ||
		*got.Spec.MinReplicas != 1 {
		t.Errorf("a v1 HPA read through v2: %+v %v", got, err)
	}

	// kube's validation, with field paths, in both versions.
	for _, tc := range []struct {
		name   string
		create func() error
		path   string
	}{
		{"v2 minReplicas -1", func() error {
			bad := hpa.DeepCopy()
			bad.Name, bad.Spec.MinReplicas = "bad", ptr[int32](-1)
			_, err := v2.Create(ctx, bad, metav1.CreateOptions{})
			return err
		}, "spec.minReplicas"},
		// Scaling to zero (HPAScaleToZero, beta and on in 1.37) needs an Object or External metric.
		{"v2 minReplicas 0 on CPU", func() error {
			bad := hpa.DeepCopy()
			bad.Name, bad.Spec.MinReplicas = "bad", ptr[int32](0)
			_, err := v2.Create(ctx, bad, metav1.CreateOptions{})
			return err
		}, "spec.metrics"},
		{"v1 maxReplicas below minReplicas", func() error {
			_, err := v1.Create(ctx, &autoscalingv1.HorizontalPodAutoscaler{ObjectMeta: metav1.ObjectMeta{Name: "bad"},
				Spec: autoscalingv1.HorizontalPodAutoscalerSpec{ScaleTargetRef: autoscalingv1.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "web"},
					MinReplicas: ptr[int32](4), MaxReplicas: 3}}, metav1.CreateOptions{})
			return err
		}, "spec.maxReplicas"},
		{"v2 scale target without a name", func() error {
			bad := hpa.DeepCopy()
			bad.Name, bad.Spec.ScaleTargetRef.Name = "bad", ""
			_, err := v2.Create(ctx, bad, metav1.CreateOptions{})
			return err
		}, "spec.scaleTargetRef.name"},
	} {
		if err := tc.create(); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.path) {
			t.Errorf("%s: %v; want 422 naming %s", tc.name, err, tc.path)
		}
	}

	// The status changes only through /status, and /status changes only the status.
	now.Status.CurrentReplicas = 9
	now, err = v2.Update(ctx, now, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if now.Status.CurrentReplicas != 0 {
		t.Error("an update of the resource changed the status")
	}
	now.Status = autoscalingv2.HorizontalPodAutoscalerStatus{CurrentReplicas: 3, DesiredReplicas: 4,
		Conditions: []autoscalingv2.HorizontalPodAutoscalerCondition{{Type: autoscalingv2.AbleToScale, Status: corev1.ConditionTrue,
			Reason: "ReadyForNewScale", LastTransitionTime: metav1.Now()}}}
	now.Spec.MaxReplicas = 10
	if now, err = v2.UpdateStatus(ctx, now, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if now.Status.CurrentReplicas != 3 || now.Spec.MaxReplicas != 6 {
		t.Errorf("after a status update: currentReplicas %d (want 3), maxReplicas %d (want 6)", now.Status.CurrentReplicas, now.Spec.MaxReplicas)
	}
	if got, err := v1.Get(ctx, "web", metav1.GetOptions{}); err != nil || got.Status.CurrentReplicas != 3 || got.Status.DesiredReplicas != 4 ||
		!strings.Contains(got.Annotations["autoscaling.alpha.kubernetes.io/conditions"], "AbleToScale") {
		t.Errorf("status read through v1: %+v %v %v", got.Status, got.Annotations, err)
	}

	// Server-side apply (its type converter reads the OpenAPI models of both versions), and the models
	// themselves, which kubectl explain reads.
	if _, err := v1.Patch(ctx, "rc", types.ApplyPatchType, []byte(`{"apiVersion":"autoscaling/v1","kind":"HorizontalPodAutoscaler",`+
		`"metadata":{"name":"rc"},"spec":{"scaleTargetRef":{"kind":"ReplicationController","name":"rc"},"maxReplicas":8}}`),
		metav1.PatchOptions{FieldManager: "test", Force: ptr(true)}); err != nil {
		t.Errorf("server-side apply through v1: %v", err)
	} else if got, err := v2.Get(ctx, "rc", metav1.GetOptions{}); err != nil || got.Spec.MaxReplicas != 8 || len(got.ManagedFields) != 2 {
		t.Errorf("after an apply through v1, v2 maxReplicas %d and managed fields %+v: %v", got.Spec.MaxReplicas, got.ManagedFields, err)
	}
	for _, gv := range []string{"v1", "v2"} {
		doc, err := c.Discovery().RESTClient().Get().AbsPath("/openapi/v3/apis/autoscaling/" + gv).DoRaw(ctx)
		if err != nil || !strings.Contains(string(doc), "io.k8s.api.autoscaling."+gv+".HorizontalPodAutoscaler") {
			t.Errorf("/openapi/v3/apis/autoscaling/%s without the HorizontalPodAutoscaler model: %v", gv, err)
		}
	}

	// Field selectors in both versions.
	if l, err := v1.List(ctx, metav1.ListOptions{FieldSelector: "metadata.name=web"}); err != nil || len(l.Items) != 1 {
		t.Errorf("v1 list by metadata.name: %v %v", l, err)
	}

	// kubectl get hpa's table, in both versions.
	for _, version := range []string{"v1", "v2"} {
		table := &metav1.Table{}
		client := c.AutoscalingV2().RESTClient()
		if version == "v1" {
			client = c.AutoscalingV1().RESTClient()
		}
		if err := client.Get().Namespace(ns).Resource("horizontalpodautoscalers").Name("web").
			SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").Do(ctx).Into(table); err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, col := range table.ColumnDefinitions {
			names = append(names, col.Name)
		}
		const want = "Name,Reference,Targets,MinPods,MaxPods,Replicas,Age"
		if got := strings.Join(names, ","); got != want || len(table.Rows) != 1 {
			t.Fatalf("%s table: columns %s and %d rows; want %s and 1", version, got, len(table.Rows), want)
		}
		if got := fmt.Sprintln(table.Rows[0].Cells...); !strings.HasPrefix(got, "web Deployment/web memory: <unknown>/100Mi, cpu: <unknown>/50% 2 6 3") {
			t.Errorf("%s table row %q", version, got)
		}
	}

	// Discovery: both versions, v2 preferred, with the short name and the category.
	groups, err := c.Discovery().ServerGroups()
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(groups.Groups, func(g metav1.APIGroup) bool { return g.Name == "autoscaling" })
	if i < 0 || groups.Groups[i].PreferredVersion.Version != "v2" || len(groups.Groups[i].Versions) != 2 ||
		groups.Groups[i].Versions[0].Version != "v2" || groups.Groups[i].Versions[1].Version != "v1" {
		t.Errorf("discovery of the autoscaling group: %+v", groups.Groups)
	}
	for _, gv := range []string{"autoscaling/v1", "autoscaling/v2"} {
		resources, err := c.Discovery().ServerResourcesForGroupVersion(gv)
		if err != nil {
			t.Fatalf("%s: %v", gv, err)
		}
		var names []string
		for _, r := range resources.APIResources {
			names = append(names, r.Name)
			if r.Name == "horizontalpodautoscalers" && (!slices.Equal(r.ShortNames, []string{"hpa"}) || !slices.Equal(r.Categories, []string{"all"}) || !r.Namespaced) {
				t.Errorf("%s horizontalpodautoscalers: %+v", gv, r)
			}
		}
		slices.Sort(names)
		if !slices.Equal(names, []string{"horizontalpodautoscalers", "horizontalpodautoscalers/status"}) {
			t.Errorf("%s resources %v", gv, names)
		}
	}
	// The legacy document of the group, as read without the client's aggregated discovery.
	group := &metav1.APIGroup{}
	if err := getJSON(ctx, c, "/apis/autoscaling", "application/json", group); err != nil ||
		group.PreferredVersion.Version != "v2" || len(group.Versions) != 2 {
		t.Errorf("/apis/autoscaling: %+v %v", group, err)
	}
	// Aggregated discovery lists v2 first, the aggregator's APIServices ranking it above v1.
	deadline := time.Now().Add(30 * time.Second)
	for {
		var versions []string
		list := &apidiscoveryv2.APIGroupDiscoveryList{}
		err := getJSON(ctx, c, "/apis", "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList", list)
		for _, g := range list.Items {
			if g.Name == "autoscaling" {
				for _, v := range g.Versions {
					versions = append(versions, v.Version)
				}
			}
		}
		if err == nil && slices.Equal(versions, []string{"v2", "v1"}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("aggregated discovery of autoscaling: versions %v, %v; want [v2 v1]", versions, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// getJSON reads a path of the API as JSON of the given media type into out.
func getJSON(ctx context.Context, c kubernetes.Interface, path, accept string, out any) error {
	body, err := c.Discovery().RESTClient().Get().AbsPath(path).SetHeader("Accept", accept).DoRaw(ctx)
	if err != nil {
		return err
	}
	return json.Unmarshal(body, out)
}
