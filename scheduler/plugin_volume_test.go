package scheduler

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// fakeClaims is a ClaimSource over maps.
type fakeClaims struct {
	claims  map[string]*corev1.PersistentVolumeClaim
	volumes map[string]*corev1.PersistentVolume
	classes map[string]*storagev1.StorageClass
}

func (f fakeClaims) Claim(ns, name string) (*corev1.PersistentVolumeClaim, error) {
	if c, ok := f.claims[name]; ok {
		return c, nil
	}
	return nil, apierrors.NewNotFound(corev1.Resource("persistentvolumeclaims"), name)
}
func (f fakeClaims) Volume(name string) (*corev1.PersistentVolume, error) {
	if v, ok := f.volumes[name]; ok {
		return v, nil
	}
	return nil, apierrors.NewNotFound(corev1.Resource("persistentvolumes"), name)
}
func (f fakeClaims) Class(name string) (*storagev1.StorageClass, error) {
	if c, ok := f.classes[name]; ok {
		return c, nil
	}
	return nil, apierrors.NewNotFound(storagev1.Resource("storageclasses"), name)
}

func claimPod(claims ...string) *corev1.Pod {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default", UID: "p-uid"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i"}}}}
	for _, c := range claims {
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: c,
			VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: c}}})
	}
	return pod
}

func TestVolumeBinding(t *testing.T) {
	class := func(name string, mode storagev1.VolumeBindingMode) *storagev1.StorageClass {
		return &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, VolumeBindingMode: &mode}
	}
	claim := func(name, class, volume string) *corev1.PersistentVolumeClaim {
		return &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", ResourceVersion: "7"},
			Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &class, VolumeName: volume}}
	}
	pinned := func(name, node string) *corev1.PersistentVolume {
		return &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PersistentVolumeSpec{
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: hostKey, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}}}}}
	}
	deleting := claim("going", "local", "")
	deleting.DeletionTimestamp = &metav1.Time{}
	src := fakeClaims{
		claims: map[string]*corev1.PersistentVolumeClaim{
			"on-b": claim("on-b", "local", "pv-b"), "free": claim("free", "", "pv-free"), "waits": claim("waits", "local", ""),
			"immediate": claim("immediate", "fast", ""), "going": deleting, "also-on-a": claim("also-on-a", "local", "pv-a"),
		},
		volumes: map[string]*corev1.PersistentVolume{"pv-b": pinned("pv-b", "b"), "pv-a": pinned("pv-a", "a"),
			"pv-free": {ObjectMeta: metav1.ObjectMeta{Name: "pv-free"}}},
		classes: map[string]*storagev1.StorageClass{"local": class("local", storagev1.VolumeBindingWaitForFirstConsumer),
			"fast": class("fast", storagev1.VolumeBindingImmediate)},
	}
	nodes := []*corev1.Node{stdNode("a", nil), stdNode("b", nil), stdNode("c", nil)}
	for _, tt := range []struct {
		name   string
		claims []string
		want   string // the node, or a piece of the failure
	}{
		{"bound to a volume on b", []string{"on-b"}, "b"},
		{"bound to a volume anywhere, with one on b", []string{"free", "on-b"}, "b"},
		{"volumes on two nodes", []string{"on-b", "also-on-a"}, "3 node(s) had volume node affinity conflict"},
		{"missing claim", []string{"nope"}, `persistentvolumeclaim "nope" not found`},
		{"claim being deleted", []string{"going"}, `persistentvolumeclaim "going" is being deleted`},
		{"unbound immediate claim", []string{"immediate"}, "pod has unbound immediate PersistentVolumeClaims"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newTestScheduler(1, nodes, nil)
			s.claims = src
			host, fitErr := decide(s, claimPod(tt.claims...))
			got := host
			if fitErr != nil {
				got = fitErr.Error()
			}
			if !strings.Contains(got, tt.want) || (fitErr == nil && got != tt.want) {
				t.Fatalf("got %q, want %q", got, tt.want)
			}
		})
	}

	// A claim that waits for its first consumer fits every node; binding names the chosen node on it first.
	s := newTestScheduler(1, nodes, nil)
	s.claims = src
	client := fake.NewClientset(src.claims["waits"])
	s.client = client
	host, fitErr := decide(s, claimPod("waits", "on-b"))
	if fitErr != nil || host != "b" {
		t.Fatalf("decide: %q %v", host, fitErr)
	}
	if err := s.annotateSelectedNode(context.Background(), claimPod("waits", "on-b"), host); err != nil {
		t.Fatal(err)
	}
	got, err := client.CoreV1().PersistentVolumeClaims("default").Get(context.Background(), "waits", metav1.GetOptions{})
	if err != nil || got.Annotations[SelectedNodeAnnotation] != "b" {
		t.Fatalf("claim after binding: %v %v", got.Annotations, err)
	}
}
