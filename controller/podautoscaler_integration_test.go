package controller_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/internal/servertest"
)

// TestHorizontalPodAutoscaler: Kubernetes' HPA controller, acting as its own service account, reads a
// Deployment's scale, raises it to the HPA's minReplicas, and writes the HPA's status through /status (the
// desired replicas, the AbleToScale condition).
func TestHorizontalPodAutoscaler(t *testing.T) {
	t.Parallel()
	c := servertest.Shared(t).Client
	ctx := context.Background()
	const ns = "hpa-test"
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	one, two := int32(1), int32(2)
	labels := map[string]string{"app": "web"}
	if _, err := c.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: appsv1.DeploymentSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Name: "web", Image: "busybox", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}}}}}}}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	utilization := int32(50)
	if _, err := c.AutoscalingV2().HorizontalPodAutoscalers(ns).Create(ctx, &autoscalingv2.HorizontalPodAutoscaler{ObjectMeta: metav1.ObjectMeta{Name: "web"},
		Spec: autoscalingv2.HorizontalPodAutoscalerSpec{
			ScaleTargetRef: autoscalingv2.CrossVersionObjectReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "web"},
			MinReplicas:    &two, MaxReplicas: 4,
			Metrics: []autoscalingv2.MetricSpec{{Type: autoscalingv2.ResourceMetricSourceType, Resource: &autoscalingv2.ResourceMetricSource{
				Name: corev1.ResourceCPU, Target: autoscalingv2.MetricTarget{Type: autoscalingv2.UtilizationMetricType, AverageUtilization: &utilization}}}},
		}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, "the HPA to scale its Deployment to minReplicas", 60*time.Second, func() error {
		d, err := c.AppsV1().Deployments(ns).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return err
		}
		hpa, err := c.AutoscalingV2().HorizontalPodAutoscalers(ns).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return err
		}
		able := false
		for _, cond := range hpa.Status.Conditions {
			able = able || cond.Type == autoscalingv2.AbleToScale && cond.Status == corev1.ConditionTrue
		}
		if *d.Spec.Replicas != 2 || hpa.Status.DesiredReplicas != 2 || !able || hpa.Status.LastScaleTime == nil {
			return fmt.Errorf("deployment replicas %d, HPA status %+v", *d.Spec.Replicas, hpa.Status)
		}
		return nil
	})
}
