package scheduler

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// TestNominatedRoomIsKept: once a pod has preempted its way onto a node, the room it waits for is not given
// to a pod of lower priority, but the pod itself, and pods above it, still fit.
func TestNominatedRoomIsKept(t *testing.T) {
	cpuPod := func(name string, priority int32, node string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: types.UID(name)},
			Spec: corev1.PodSpec{NodeName: node, Priority: &priority, Containers: []corev1.Container{{Name: "c",
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1")}}}}},
		}
	}
	s := New(Config{Seed: 1})
	alloc := corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("4Gi"), corev1.ResourcePods: resource.MustParse("10")}
	s.cache.SetNode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{Allocatable: alloc}})
	s.cache.SetPod(cpuPod("resident", 0, "n1"))
	vip := cpuPod("vip", 1000, "")
	s.nominated.set(vip, "n1")

	decide := func(p *corev1.Pod) (string, *FitError) {
		snap := s.cache.Snapshot()
		defer snap.Release()
		return s.decide(context.Background(), NewPodInfo(p), snap)
	}
	if host, fitErr := decide(cpuPod("low", 0, "")); fitErr == nil {
		t.Fatalf("a priority-0 pod took the room kept for the nominated pod (on %s)", host)
	}
	for _, p := range []*corev1.Pod{vip, cpuPod("higher", 2000, "")} {
		if host, fitErr := decide(p); fitErr != nil || host != "n1" {
			t.Fatalf("%s: %q %v, want n1", p.Name, host, fitErr)
		}
	}
	s.nominated.set(vip, "") // bound or deleted: the room is free for anyone
	if host, fitErr := decide(cpuPod("low", 0, "")); fitErr != nil || host != "n1" {
		t.Fatalf("after the nomination ended: %q %v", host, fitErr)
	}
}
