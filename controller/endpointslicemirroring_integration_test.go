package controller_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/internal/servertest"
)

// TestEndpointSliceMirroring: the Endpoints a user writes for a Service without a selector are mirrored
// into an EndpointSlice by Kubernetes' mirroring controller, follow its changes, and go with it.
func TestEndpointSliceMirroring(t *testing.T) {
	t.Parallel()
	p := servertest.Shared(t)
	c := p.Client
	ns := servertest.Namespace(t, p, "mirror")
	ctx := context.Background()
	if _, err := c.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "ext"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	endpoints := func(ips ...string) *corev1.Endpoints {
		ep := &corev1.Endpoints{ObjectMeta: metav1.ObjectMeta{Name: "ext"}, Subsets: []corev1.EndpointSubset{{
			Ports: []corev1.EndpointPort{{Name: "http", Port: 8080, Protocol: corev1.ProtocolTCP}}}}}
		for _, ip := range ips {
			ep.Subsets[0].Addresses = append(ep.Subsets[0].Addresses, corev1.EndpointAddress{IP: ip})
		}
		return ep
	}
	// mirrored waits until the mirrored slices of ext hold exactly these addresses, on port 8080.
	mirrored := func(want ...string) {
		t.Helper()
		proctest.WaitFor(t, fmt.Sprintf("slices mirroring %v", want), 20*time.Second, func() error {
			list, err := c.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{
				LabelSelector: discoveryv1.LabelServiceName + "=ext," + discoveryv1.LabelManagedBy + "=endpointslicemirroring-controller.k8s.io"})
			if err != nil {
				return err
			}
			var got []string
			for _, s := range list.Items {
				if len(s.Ports) != 1 || s.Ports[0].Port == nil || *s.Ports[0].Port != 8080 {
					return fmt.Errorf("slice %s ports %+v", s.Name, s.Ports)
				}
				for _, e := range s.Endpoints {
					got = append(got, e.Addresses...)
				}
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				return fmt.Errorf("mirrored %v", got)
			}
			return nil
		})
	}
	if _, err := c.CoreV1().Endpoints(ns).Create(ctx, endpoints("10.1.2.3"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	mirrored("10.1.2.3")
	ep, err := c.CoreV1().Endpoints(ns).Get(ctx, "ext", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ep.Subsets = endpoints("10.1.2.3", "10.1.2.4").Subsets
	if _, err := c.CoreV1().Endpoints(ns).Update(ctx, ep, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	mirrored("10.1.2.3", "10.1.2.4")
	if err := c.CoreV1().Endpoints(ns).Delete(ctx, "ext", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	mirrored()
}
