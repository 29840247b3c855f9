package apiserver_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/internal/servertest"
)

// TestLimitRanger: a LimitRange gets Kubernetes' defaults; a pod without resources gets the Container
// item's default limits and requests (and the kubernetes.io/limit-ranger annotation); containers and pods
// beyond min, max or maxLimitRequestRatio, and claims beyond the PersistentVolumeClaim item's, are refused
// with Kubernetes' messages.
func TestLimitRanger(t *testing.T) {
	t.Parallel()
	shared := servertest.Shared(t)
	c := shared.Client
	ns := servertest.Namespace(t, shared, "limitranger")
	ctx := context.Background()
	q := resource.MustParse
	lr, err := c.CoreV1().LimitRanges(ns).Create(ctx, &corev1.LimitRange{ObjectMeta: metav1.ObjectMeta{Name: "limits"},
		Spec: corev1.LimitRangeSpec{Limits: []corev1.LimitRangeItem{
			{Type: corev1.LimitTypeContainer, Max: corev1.ResourceList{corev1.ResourceCPU: q("1")},
				Min:                  corev1.ResourceList{corev1.ResourceMemory: q("8Mi")},
				Default:              corev1.ResourceList{corev1.ResourceMemory: q("64Mi")},
				MaxLimitRequestRatio: corev1.ResourceList{corev1.ResourceMemory: q("4")}},
			{Type: corev1.LimitTypePod, Max: corev1.ResourceList{corev1.ResourceMemory: q("200Mi")}},
			{Type: corev1.LimitTypePersistentVolumeClaim, Min: corev1.ResourceList{corev1.ResourceStorage: q("1Gi")}},
		}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Kubernetes' defaults: the default limit from max, the default request from the default limit.
	item := lr.Spec.Limits[0]
	if item.Default.Cpu().String() != "1" || item.DefaultRequest.Memory().String() != "64Mi" || item.DefaultRequest.Cpu().String() != "1" {
		t.Fatalf("LimitRange defaults: default %v, defaultRequest %v", item.Default, item.DefaultRequest)
	}

	container := func(name string, requests, limits corev1.ResourceList) corev1.Container {
		return corev1.Container{Name: name, Image: "busybox", Resources: corev1.ResourceRequirements{Requests: requests, Limits: limits}}
	}
	pod := func(name string, cs ...corev1.Container) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{Containers: cs}}
	}
	var got *corev1.Pod
	proctest.WaitFor(t, "the LimitRange in the server's informer", 10*time.Second, func() error {
		c.CoreV1().Pods(ns).Delete(ctx, "plain", metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
		var err error
		got, err = c.CoreV1().Pods(ns).Create(ctx, pod("plain", container("app", nil, nil)), metav1.CreateOptions{})
		if err == nil && got.Spec.Containers[0].Resources.Limits == nil {
			return errors.New("not defaulted yet")
		}
		return err
	})
	res := got.Spec.Containers[0].Resources
	if res.Limits.Cpu().String() != "1" || res.Limits.Memory().String() != "64Mi" || res.Requests.Cpu().String() != "1" || res.Requests.Memory().String() != "64Mi" {
		t.Fatalf("defaulted resources: %+v", res)
	}
	if a := got.Annotations["kubernetes.io/limit-ranger"]; a != "LimitRanger plugin set: cpu, memory request for container app; cpu, memory limit for container app" {
		t.Fatalf("limit-ranger annotation %q", a)
	}

	for _, tt := range []struct {
		name string
		pod  *corev1.Pod
		want string
	}{
		{"cpu over max", pod("big", container("app", nil, corev1.ResourceList{corev1.ResourceCPU: q("2")})),
			"maximum cpu usage per Container is 1, but limit is 2"},
		{"memory under min", pod("small", container("app", corev1.ResourceList{corev1.ResourceMemory: q("4Mi")}, corev1.ResourceList{corev1.ResourceMemory: q("4Mi")})),
			"minimum memory usage per Container is 8Mi, but request is 4Mi"},
		{"ratio", pod("ratio", container("app", corev1.ResourceList{corev1.ResourceMemory: q("10Mi")}, corev1.ResourceList{corev1.ResourceMemory: q("100Mi")})),
			"memory max limit to request ratio per Container is 4, but provided ratio is 10.000000"},
		{"pod over max", pod("wide", container("a", nil, corev1.ResourceList{corev1.ResourceMemory: q("150Mi")}), container("b", nil, corev1.ResourceList{corev1.ResourceMemory: q("150Mi")})),
			"maximum memory usage per Pod is 200Mi, but limit is 300Mi"},
	} {
		_, err := c.CoreV1().Pods(ns).Create(ctx, tt.pod, metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want 403 with %q", tt.name, err, tt.want)
		}
	}
	_, err = c.CoreV1().PersistentVolumeClaims(ns).Create(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "tiny"},
		Spec: corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: q("500Mi")}}}}, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "minimum storage usage per PersistentVolumeClaim is 1Gi, but request is 500Mi") {
		t.Fatalf("small claim: %v", err)
	}
}
