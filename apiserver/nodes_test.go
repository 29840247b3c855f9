package apiserver_test

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/internal/servertest"
)

// TestNodePodCIDRs checks that each Node gets its own /24 of cluster_cidr, that a named podCIDR is claimed
// (and refused when taken), that a deleted Node's CIDR is reused, that a full cluster CIDR leaves new Nodes
// without one, and that a podCIDR cannot change.
func TestNodePodCIDRs(t *testing.T) {
	t.Parallel()
	clusterCIDR := "10.50.0.0/22" // four /24s
	peers := servertest.StartWith(t, 1, func(f *config.ServerFile) { f.Server.ClusterCIDR = &clusterCIDR })
	ctx := context.Background()
	nodes := peers[0].Client.CoreV1().Nodes()
	create := func(name, podCIDR string) (*corev1.Node, error) {
		return nodes.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDR: podCIDR}}, metav1.CreateOptions{})
	}
	got := map[string]string{}
	for _, name := range []string{"a", "b"} {
		n, err := create(name, "")
		if err != nil {
			t.Fatal(err)
		}
		got[name] = n.Spec.PodCIDR
	}
	if got["a"] != "10.50.0.0/24" || got["b"] != "10.50.1.0/24" {
		t.Fatalf("assigned %v", got)
	}
	if n, err := create("c", "10.50.3.0/24"); err != nil || n.Spec.PodCIDR != "10.50.3.0/24" || len(n.Spec.PodCIDRs) != 1 {
		t.Fatalf("named CIDR: %v %v", n, err)
	}
	if _, err := create("d", "10.50.3.0/24"); !apierrors.IsInvalid(err) {
		t.Fatalf("a taken CIDR: %v, want 422", err)
	}
	if _, err := create("d", "10.50.3.7/24"); !apierrors.IsInvalid(err) {
		t.Fatalf("a host address as CIDR: %v, want 422", err)
	}
	if n, err := create("d", ""); err != nil || n.Spec.PodCIDR != "10.50.2.0/24" {
		t.Fatalf("last free CIDR: %v %v", n, err)
	}
	if n, err := create("e", ""); err != nil || n.Spec.PodCIDR != "" {
		t.Fatalf("with the cluster CIDR full: %v %v, want a Node without a pod CIDR", n, err)
	}
	if err := nodes.Delete(ctx, "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if n, err := create("f", ""); err != nil || n.Spec.PodCIDR != "10.50.1.0/24" {
		t.Fatalf("after deleting b: %v %v, want b's CIDR", n, err)
	}
	a, _ := nodes.Get(ctx, "a", metav1.GetOptions{})
	a.Spec.PodCIDR = "10.50.9.0/24"
	if _, err := nodes.Update(ctx, a, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) {
		t.Fatalf("changing a podCIDR: %v, want 422", err)
	}
	e, _ := nodes.Get(ctx, "e", metav1.GetOptions{})
	e.Spec.PodCIDR = "10.50.1.0/24"
	if _, err := nodes.Update(ctx, e, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) {
		t.Fatalf("setting a podCIDR by update: %v, want 422", err)
	}
	// An agent registering again with its own pod_cidr gets AlreadyExists, and the CIDR stays its own.
	if _, err := create("c", "10.50.3.0/24"); !apierrors.IsAlreadyExists(err) {
		t.Fatalf("re-registering c: %v, want 409 AlreadyExists", err)
	}
	if _, err := create("g", "10.50.3.0/24"); !apierrors.IsInvalid(err) {
		t.Fatalf("c's CIDR after c re-registered: %v, want 422 (still held)", err)
	}
	// A collection delete gives every CIDR back.
	if err := nodes.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatal(err)
	}
	if n, err := create("h", ""); err != nil || n.Spec.PodCIDR != "10.50.0.0/24" {
		t.Fatalf("after deleting every node: %v %v, want the first CIDR", n, err)
	}
}
