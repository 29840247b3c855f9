package dns

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/internal/servertest"
)

// The node's slice is created, brought to the wanted readiness, left alone when already right, and removed
// by the garbage collector with its Node.
func TestNodeSliceLifecycle(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a server")
	}
	client := servertest.Start(t, 1)[0].Client
	ctx := context.Background()
	node, err := client.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := ApplySlice(ctx, client, Slice(node, "10.244.1.1", false)); err != nil {
		t.Fatal(err)
	}
	if err := ApplySlice(ctx, client, Slice(node, "10.244.1.1", true)); err != nil {
		t.Fatal(err)
	}
	got, err := client.DiscoveryV1().EndpointSlices(ServiceNamespace).Get(ctx, SliceName("n1"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ep := got.Endpoints[0]
	if !*ep.Conditions.Ready || ep.Addresses[0] != "10.244.1.1" || *ep.NodeName != "n1" || len(got.Ports) != 2 ||
		got.Labels["kubernetes.io/service-name"] != "kube-dns" || got.OwnerReferences[0].UID != node.UID {
		t.Fatalf("slice %+v", got)
	}
	if err := ApplySlice(ctx, client, Slice(node, "10.244.1.1", true)); err != nil {
		t.Fatal(err)
	}
	again, _ := client.DiscoveryV1().EndpointSlices(ServiceNamespace).Get(ctx, SliceName("n1"), metav1.GetOptions{})
	if again.ResourceVersion != got.ResourceVersion {
		t.Errorf("an apply with nothing to change wrote the slice")
	}
	if err := client.CoreV1().Nodes().Delete(ctx, "n1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := client.DiscoveryV1().EndpointSlices(ServiceNamespace).Get(ctx, SliceName("n1"), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the slice outlived its Node by 30 s: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
