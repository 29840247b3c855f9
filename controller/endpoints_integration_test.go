package controller_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/skiff-dev/skiff/internal/servertest"
)

const epTestNamespace = "ep-test"

// runPod creates a pod bound to node-a and reports it Running and Ready with the given IP, as a node agent
// would.
func runPod(t *testing.T, c kubernetes.Interface, name, ip string) {
	t.Helper()
	ctx := context.Background()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: epTestNamespace, Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "web", Image: "web:1",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}}}},
	}
	created, err := c.CoreV1().Pods(epTestNamespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status.Phase = corev1.PodRunning
	created.Status.PodIP, created.Status.PodIPs = ip, []corev1.PodIP{{IP: ip}}
	created.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
	if _, err := c.CoreV1().Pods(epTestNamespace).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// sliceState renders the Service's managed EndpointSlices as "pod:ip:conditions" sorted, with the port.
func sliceState(t *testing.T, c kubernetes.Interface) string {
	t.Helper()
	list, err := c.DiscoveryV1().EndpointSlices(epTestNamespace).List(context.Background(), metav1.ListOptions{
		LabelSelector: discoveryv1.LabelServiceName + "=web," + discoveryv1.LabelManagedBy + "=endpointslice-controller.k8s.io"})
	if err != nil {
		t.Fatal(err)
	}
	var eps []string
	for _, s := range list.Items {
		for _, ep := range s.Endpoints {
			port := "-"
			if len(s.Ports) == 1 {
				port = fmt.Sprint(*s.Ports[0].Port)
			}
			zone := "-"
			if ep.Zone != nil {
				zone = *ep.Zone
			}
			eps = append(eps, fmt.Sprintf("%s:%s:%s:%s:ready=%t,serving=%t,terminating=%t", ep.TargetRef.Name, ep.Addresses[0], port, zone,
				*ep.Conditions.Ready, *ep.Conditions.Serving, *ep.Conditions.Terminating))
		}
	}
	slices.Sort(eps)
	return fmt.Sprintf("%d slices %v", len(list.Items), eps)
}

// endpointsState renders the Service's Endpoints as "ready|notready|ports" per subset, or "none".
func endpointsState(t *testing.T, c kubernetes.Interface) string {
	t.Helper()
	ep, err := c.CoreV1().Endpoints(epTestNamespace).Get(context.Background(), "web", metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "none"
	}
	if err != nil {
		t.Fatal(err)
	}
	var parts []string
	for _, ss := range ep.Subsets {
		var ready, notReady, ports []string
		for _, a := range ss.Addresses {
			ready = append(ready, a.IP)
		}
		for _, a := range ss.NotReadyAddresses {
			notReady = append(notReady, a.IP)
		}
		for _, p := range ss.Ports {
			ports = append(ports, fmt.Sprint(p.Port))
		}
		parts = append(parts, strings.Join(ready, ",")+"|"+strings.Join(notReady, ",")+"|"+strings.Join(ports, ","))
	}
	return strings.Join(parts, " ")
}

// TestEndpointControllers runs both endpoint controllers on a real server: a Service's pods appear in its
// EndpointSlice and Endpoints, a pod whose deletion begins turns terminating at once, and the Service's
// deletion takes its objects away.
func TestEndpointControllers(t *testing.T) {
	// A server of its own: its node would take the pods of the other tests' workloads.
	t.Parallel()
	c := servertest.Start(t, 1)[0].Client
	ctx := context.Background()
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: epTestNamespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", Labels: map[string]string{corev1.LabelTopologyZone: "zone-1"}}}
	if _, err := c.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: epTestNamespace},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "web"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("http")}}},
	}
	if _, err := c.CoreV1().Services(epTestNamespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// With no pods yet, the Service gets an empty slice and an empty Endpoints, as in Kubernetes.
	waitFor(t, "an empty slice", func() (bool, string) {
		s := sliceState(t, c)
		return s == "1 slices []", s
	})

	runPod(t, c, "web-1", "10.244.0.11")
	runPod(t, c, "web-2", "10.244.0.12")
	want := "1 slices [web-1:10.244.0.11:8080:zone-1:ready=true,serving=true,terminating=false web-2:10.244.0.12:8080:zone-1:ready=true,serving=true,terminating=false]"
	waitFor(t, "both pods in the slice", func() (bool, string) {
		s := sliceState(t, c)
		return s == want, s
	})
	waitFor(t, "both pods in the Endpoints", func() (bool, string) {
		s := endpointsState(t, c)
		return s == "10.244.0.11,10.244.0.12||8080", s
	})

	// Deletion begins (no agent confirms it, so the pod stays): the endpoint turns terminating at once.
	start := time.Now()
	if err := c.CoreV1().Pods(epTestNamespace).Delete(ctx, "web-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want = "1 slices [web-1:10.244.0.11:8080:zone-1:ready=false,serving=true,terminating=true web-2:10.244.0.12:8080:zone-1:ready=true,serving=true,terminating=false]"
	waitFor(t, "the deleted pod's endpoint to turn terminating", func() (bool, string) {
		s := sliceState(t, c)
		return s == want, s
	})
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("the endpoint turned terminating %v after the delete", took)
	}
	t.Logf("endpoint terminating %v after the delete", time.Since(start))
	waitFor(t, "the deleted pod out of the Endpoints", func() (bool, string) {
		s := endpointsState(t, c)
		return s == "10.244.0.12||8080", s
	})

	if err := c.CoreV1().Services(epTestNamespace).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the Service's objects to go", func() (bool, string) {
		s, e := sliceState(t, c), endpointsState(t, c)
		return s == "0 slices []" && e == "none", s + " / " + e
	})
}
