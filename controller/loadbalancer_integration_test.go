package controller_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/skiff-dev/skiff/internal/lbpool"
	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/internal/servertest"
)

// TestLoadBalancerAddresses: LoadBalancer Services get addresses from the servers' pools (the shared
// server's default pool has two), never the same one twice; a full pool is a warning event, and the Service
// gets the address another gives up (deleted, or no longer a LoadBalancer); a Service asks for a named pool
// with the annotation and for an address with spec.loadBalancerIP, which the API refuses outside every pool;
// a Service of another loadBalancerClass is left alone.
func TestLoadBalancerAddresses(t *testing.T) {
	t.Parallel()
	peer := servertest.Shared(t)
	ns := servertest.Namespace(t, peer, "loadbalancers")
	ctx := context.Background()
	services := peer.Client.CoreV1().Services(ns)
	create := func(name string, mutate func(*corev1.Service)) {
		t.Helper()
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Port: 80}}}}
		if mutate != nil {
			mutate(svc)
		}
		if _, err := services.Create(ctx, svc, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating %s: %v", name, err)
		}
	}
	address := func(name string) string {
		svc, err := services.Get(ctx, name, metav1.GetOptions{})
		if err != nil || len(svc.Status.LoadBalancer.Ingress) == 0 {
			return ""
		}
		return svc.Status.LoadBalancer.Ingress[0].IP
	}
	waitAddress := func(name string, in ...string) string {
		t.Helper()
		var got string
		proctest.WaitFor(t, name+" to get an address", 30*time.Second, func() error {
			if got = address(name); got == "" {
				return fmt.Errorf("none yet")
			}
			return nil
		})
		for _, want := range in {
			if got == want {
				return got
			}
		}
		t.Fatalf("%s got %s, want one of %v", name, got, in)
		return ""
	}
	waitEvent := func(name, reason, message string) {
		t.Helper()
		proctest.WaitFor(t, fmt.Sprintf("a %s event on %s", reason, name), 30*time.Second, func() error {
			events, err := peer.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
			if err != nil {
				return err
			}
			for _, e := range events.Items {
				if e.Reason == reason && strings.Contains(e.Message, message) {
					return nil
				}
			}
			return fmt.Errorf("%d events, none %s %q", len(events.Items), reason, message)
		})
	}

	create("a", nil)
	create("b", nil)
	a, b := waitAddress("a", "192.0.2.1", "192.0.2.2"), waitAddress("b", "192.0.2.1", "192.0.2.2")
	if a == b {
		t.Fatalf("a and b both got %s", a)
	}
	create("c", nil)
	waitEvent("c", "AllocationFailed", `no free address in load balancer pool "default"`)
	if got := address("c"); got != "" {
		t.Fatalf("c got %s from a full pool", got)
	}
	if err := services.Delete(ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitAddress("c", a)

	create("other", func(s *corev1.Service) { s.Spec.LoadBalancerClass = ptrTo("example.com/other-lb") })
	create("edge", func(s *corev1.Service) { s.Annotations = map[string]string{lbpool.PoolAnnotation: "edge"} })
	waitAddress("edge", "198.51.100.8", "198.51.100.9")
	create("pinned", func(s *corev1.Service) {
		s.Annotations = map[string]string{lbpool.PoolAnnotation: "edge"}
		s.Spec.LoadBalancerIP = "198.51.100.9"
	})
	if edge := address("edge"); edge == "198.51.100.9" {
		waitEvent("pinned", "AllocationFailed", "spec.loadBalancerIP 198.51.100.9 is taken")
	} else {
		waitAddress("pinned", "198.51.100.9")
	}

	// b stops being a LoadBalancer: its address goes, to the next Service that wants one.
	if _, err := services.Patch(ctx, "b", types.MergePatchType, []byte(`{"spec":{"type":"ClusterIP","allocateLoadBalancerNodePorts":null}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, "b's status to lose its address", 30*time.Second, func() error {
		if got := address("b"); got != "" {
			return fmt.Errorf("still %s", got)
		}
		return nil
	})
	create("d", nil)
	waitAddress("d", b)
	if got := address("other"); got != "" {
		t.Fatalf("a Service of another loadBalancerClass got %s", got)
	}

	// What the pools cannot give is refused, with the field.
	for _, bad := range []struct {
		mutate func(*corev1.Service)
		field  string
	}{
		{func(s *corev1.Service) { s.Spec.LoadBalancerIP = "203.0.113.7" }, "spec.loadBalancerIP"},
		{func(s *corev1.Service) { s.Annotations = map[string]string{lbpool.PoolAnnotation: "nowhere"} }, "metadata.annotations[skiff.dev/load-balancer-pool]"},
		{func(s *corev1.Service) {
			s.Annotations = map[string]string{lbpool.PoolAnnotation: "edge"}
			s.Spec.LoadBalancerIP = "192.0.2.1"
		}, "spec.loadBalancerIP"},
	} {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "refused"}, Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeLoadBalancer, Ports: []corev1.ServicePort{{Port: 80}}}}
		bad.mutate(svc)
		_, err := services.Create(ctx, svc, metav1.CreateOptions{})
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), bad.field) {
			t.Errorf("create with %s out of the pools: %v, want 422 on %s", bad.field, err, bad.field)
		}
	}
}

func ptrTo[T any](v T) *T { return &v }
