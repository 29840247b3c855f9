package apiserver_test

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/skiff-dev/skiff/internal/servertest"
)

// TestNodePortClaimsFollowUpdates checks that NodePorts are claimed and released by updates as well as by
// creates and deletes: an update that takes a held port is refused, one that switches a Service to NodePort
// claims a port no other Service can then take, a changed nodePort frees the old one, and leaving NodePort
// frees them all.
func TestNodePortClaimsFollowUpdates(t *testing.T) {
	peers := servertest.Start(t, 1)
	ctx := context.Background()
	services := peers[0].Client.CoreV1().Services("default")
	create := func(name string, typ corev1.ServiceType, nodePort int32) (*corev1.Service, error) {
		return services.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.ServiceSpec{
			Type: typ, Ports: []corev1.ServicePort{{Port: 80, NodePort: nodePort}},
		}}, metav1.CreateOptions{})
	}
	patch := func(name, body string) (*corev1.Service, error) {
		return services.Patch(ctx, name, types.MergePatchType, []byte(body), metav1.PatchOptions{})
	}
	if _, err := create("a", corev1.ServiceTypeNodePort, 30100); err != nil {
		t.Fatal(err)
	}
	if _, err := create("b", corev1.ServiceTypeClusterIP, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := patch("b", `{"spec":{"type":"NodePort","ports":[{"port":80,"nodePort":30100}]}}`); !apierrors.IsInvalid(err) {
		t.Fatalf("an update taking a's port: %v, want 422", err)
	}
	b, err := patch("b", `{"spec":{"type":"NodePort"}}`)
	if err != nil {
		t.Fatal(err)
	}
	bPort := b.Spec.Ports[0].NodePort
	if bPort == 0 || bPort == 30100 {
		t.Fatalf("b switched to NodePort got port %d", bPort)
	}
	if _, err := create("c", corev1.ServiceTypeNodePort, bPort); !apierrors.IsInvalid(err) {
		t.Fatalf("a create taking the port b's update claimed: %v, want 422", err)
	}
	if _, err := patch("a", `{"spec":{"ports":[{"port":80,"nodePort":30101}]}}`); err != nil {
		t.Fatal(err)
	}
	if _, err := create("c", corev1.ServiceTypeNodePort, 30100); err != nil {
		t.Fatalf("the port a's update gave up: %v", err)
	}
	b, err = patch("b", `{"spec":{"type":"ClusterIP"}}`)
	if err != nil {
		t.Fatal(err)
	}
	if b.Spec.Ports[0].NodePort != 0 {
		t.Fatalf("b left NodePort but kept port %d", b.Spec.Ports[0].NodePort)
	}
	if _, err := create("d", corev1.ServiceTypeNodePort, bPort); err != nil {
		t.Fatalf("the port b gave up by leaving NodePort: %v", err)
	}
	if err := services.Delete(ctx, "d", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := create("e", corev1.ServiceTypeNodePort, bPort); err != nil {
		t.Fatalf("the port of a deleted Service: %v", err)
	}
}
