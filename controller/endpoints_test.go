package controller

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	k8stesting "k8s.io/client-go/testing"
)

// syncEndpoints runs one Endpoints sync of the Service, then waits until the informer shows the stored
// Endpoints (or their absence).
func (h *endpointHarness) syncEndpoints(t *testing.T, service string) error {
	t.Helper()
	err := h.endpoints.sync(context.Background(), epNamespace+"/"+service)
	eventually(t, "the Endpoints informer to catch up", func() bool {
		stored, serr := h.kube.CoreV1().Endpoints(epNamespace).Get(context.Background(), service, metav1.GetOptions{})
		cached, cerr := h.endpoints.endpoints.Endpoints(epNamespace).Get(service)
		if apierrors.IsNotFound(serr) {
			return apierrors.IsNotFound(cerr)
		}
		return cerr == nil && cached.ResourceVersion == stored.ResourceVersion && subsetsEqual(cached.Subsets, stored.Subsets)
	})
	return err
}

func webSelector() labels.Selector { return labels.SelectorFromSet(labels.Set{"app": "web"}) }

func (h *endpointHarness) storedEndpoints(t *testing.T, service string) *corev1.Endpoints {
	t.Helper()
	ep, err := h.kube.CoreV1().Endpoints(epNamespace).Get(context.Background(), service, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ep
}

// describeSubsets renders subsets compactly: "[ready pods | not-ready pods | ports]" per subset.
func describeSubsets(subsets []corev1.EndpointSubset) string {
	var parts []string
	for _, ss := range subsets {
		names := func(addrs []corev1.EndpointAddress) string {
			var n []string
			for _, a := range addrs {
				s := a.TargetRef.Name
				if a.Hostname != "" {
					s += "(" + a.Hostname + ")"
				}
				n = append(n, s)
			}
			return strings.Join(n, ",")
		}
		var ports []string
		for _, p := range ss.Ports {
			ports = append(ports, fmt.Sprintf("%s:%d", p.Name, p.Port))
		}
		parts = append(parts, fmt.Sprintf("[%s|%s|%s]", names(ss.Addresses), names(ss.NotReadyAddresses), strings.Join(ports, ",")))
	}
	return strings.Join(parts, " ")
}

func TestEndpointsSubsets(t *testing.T) {
	twoPorts := func(s *corev1.Service) {
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "metrics", Port: 9100, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("metrics")})
	}
	withMetrics := func(p *corev1.Pod) {
		p.Spec.Containers[0].Ports = append(p.Spec.Containers[0].Ports, corev1.ContainerPort{Name: "metrics", ContainerPort: 9100, Protocol: corev1.ProtocolTCP})
	}
	named := func(p *corev1.Pod) { p.Spec.Hostname, p.Spec.Subdomain = "host"+p.Name[len(p.Name)-1:], "web" }
	cases := []struct {
		name    string
		service *corev1.Service
		pods    []runtime.Object
		want    string
	}{
		{name: "ready, not ready, terminating, finished, no IP",
			service: webService("web"),
			pods: []runtime.Object{webPod(1), webPod(2, notReady), webPod(3, terminating), webPod(4, noIP),
				webPod(5, func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed })},
			want: "[web-0001|web-0002|web:8080]"},
		{name: "publishNotReadyAddresses keeps terminating pods, all ready",
			service: webService("web", publishNotReady),
			pods:    []runtime.Object{webPod(1), webPod(2, notReady), webPod(3, terminating)},
			want:    "[web-0001,web-0002,web-0003||web:8080]"},
		{name: "named ports per pod",
			service: webService("web"),
			pods:    []runtime.Object{webPod(1), webPod(2, httpPort(9090)), webPod(3, httpPort(9090), notReady)},
			want:    "[web-0001||web:8080] [web-0002|web-0003|web:9090]"},
		{name: "a pod without one named port serves the others",
			service: webService("web", twoPorts),
			pods:    []runtime.Object{webPod(1, withMetrics), webPod(2)},
			want:    "[web-0001||metrics:9100] [web-0001,web-0002||web:8080]"},
		{name: "hostname for pods whose subdomain is the Service",
			service: webService("web", headless),
			pods:    []runtime.Object{webPod(1, named), webPod(2)},
			want:    "[web-0001(host1),web-0002||web:8080]"},
		{name: "headless without ports",
			service: webService("web", headless, func(s *corev1.Service) { s.Spec.Ports = nil }),
			pods:    []runtime.Object{webPod(1), webPod(2, notReady)},
			want:    "[web-0001|web-0002|]"},
		{name: "no pods", service: webService("web"), want: ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newEndpointHarness(t, append([]runtime.Object{tc.service}, tc.pods...)...)
			if err := h.syncEndpoints(t, "web"); err != nil {
				t.Fatal(err)
			}
			ep := h.storedEndpoints(t, "web")
			if got := describeSubsets(ep.Subsets); got != tc.want {
				t.Errorf("subsets %s, want %s", got, tc.want)
			}
			for _, ss := range ep.Subsets {
				for _, a := range append(ss.Addresses, ss.NotReadyAddresses...) {
					n := 0
					fmt.Sscanf(a.TargetRef.Name, "web-%d", &n)
					if a.IP != fmt.Sprintf("10.244.0.%d", n+1) || a.NodeName == nil || *a.NodeName != "node-a" ||
						a.TargetRef.Kind != "Pod" || a.TargetRef.Namespace != epNamespace || a.TargetRef.UID != types.UID(fmt.Sprintf("pod-%04d", n)) {
						t.Errorf("address %+v (ref %+v)", a, a.TargetRef)
					}
				}
			}
			_, isHeadless := ep.Labels[corev1.IsHeadlessService]
			if ep.Labels["team"] != "a" || ep.Labels[discoveryv1.LabelSkipMirror] != "true" || ep.Labels["endpoints.kubernetes.io/managed-by"] != "endpoint-controller" || isHeadless != (tc.service.Spec.ClusterIP == corev1.ClusterIPNone) {
				t.Errorf("labels %v", ep.Labels)
			}
			if _, ok := ep.Annotations[corev1.EndpointsOverCapacity]; ok {
				t.Error("over-capacity annotation on a small Endpoints")
			}
		})
	}
}

// An unchanged Service is not rewritten; a change is.
func TestEndpointsUpdates(t *testing.T) {
	h := newEndpointHarness(t, webService("web"), webPod(1), webPod(2, notReady))
	if err := h.syncEndpoints(t, "web"); err != nil {
		t.Fatal(err)
	}
	writes := func() int {
		n := 0
		for _, a := range h.kube.Actions() {
			if a.GetResource().Resource == "endpoints" && (a.GetVerb() == "create" || a.GetVerb() == "update") {
				n++
			}
		}
		return n
	}
	if n := writes(); n != 1 {
		t.Fatalf("%d writes after the first sync, want 1", n)
	}
	if err := h.syncEndpoints(t, "web"); err != nil {
		t.Fatal(err)
	}
	if n := writes(); n != 1 {
		t.Fatalf("an unchanged Service was rewritten (%d writes)", n)
	}
	h.apply(t, webPod(2))
	if err := h.syncEndpoints(t, "web"); err != nil {
		t.Fatal(err)
	}
	if got := describeSubsets(h.storedEndpoints(t, "web").Subsets); writes() != 2 || got != "[web-0001,web-0002||web:8080]" {
		t.Errorf("after the pod became ready: %s (%d writes)", got, writes())
	}
	// Deletion begins: the pod leaves the Endpoints.
	h.apply(t, webPod(1, terminating))
	if err := h.syncEndpoints(t, "web"); err != nil {
		t.Fatal(err)
	}
	if got := describeSubsets(h.storedEndpoints(t, "web").Subsets); got != "[web-0002||web:8080]" {
		t.Errorf("after web-0001 began terminating: %s", got)
	}
}

func TestEndpointsCapacity(t *testing.T) {
	objs := []runtime.Object{webService("web")}
	for i := range 900 {
		objs = append(objs, webPod(i))
	}
	for i := 900; i < 1100; i++ {
		objs = append(objs, webPod(i, notReady))
	}
	h := newEndpointHarness(t, objs...)
	if err := h.syncEndpoints(t, "web"); err != nil {
		t.Fatal(err)
	}
	ep := h.storedEndpoints(t, "web")
	ready, notReadyN := 0, 0
	for _, ss := range ep.Subsets {
		ready += len(ss.Addresses)
		notReadyN += len(ss.NotReadyAddresses)
	}
	if ready != 900 || notReadyN != 100 || ep.Annotations[corev1.EndpointsOverCapacity] != "truncated" {
		t.Errorf("%d ready, %d not ready, annotations %v; want 900, 100 and over-capacity truncated", ready, notReadyN, ep.Annotations)
	}

	// Back under the cap: the annotation goes. (Deletes in batches: the fake API's watch buffers only 100.)
	for i := 0; i < 200; i++ {
		if err := h.kube.CoreV1().Pods(epNamespace).Delete(context.Background(), fmt.Sprintf("web-%04d", i), metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if i%50 == 49 {
			eventually(t, "the pods gone from the cache", func() bool {
				pods, _ := h.endpoints.pods.Pods(epNamespace).List(webSelector())
				return len(pods) == 1100-i-1
			})
		}
	}
	if err := h.syncEndpoints(t, "web"); err != nil {
		t.Fatal(err)
	}
	ep = h.storedEndpoints(t, "web")
	total := 0
	for _, ss := range ep.Subsets {
		total += len(ss.Addresses) + len(ss.NotReadyAddresses)
	}
	if _, over := ep.Annotations[corev1.EndpointsOverCapacity]; over || total != 900 {
		t.Errorf("%d addresses, annotations %v; want 900 and no over-capacity", total, ep.Annotations)
	}
}

func TestTruncateSubsets(t *testing.T) {
	addrs := func(prefix string, n int) []corev1.EndpointAddress {
		out := make([]corev1.EndpointAddress, n)
		for i := range out {
			out[i] = corev1.EndpointAddress{IP: fmt.Sprintf("%s.%d", prefix, i)}
		}
		return out
	}
	cases := []struct {
		name          string
		in            []corev1.EndpointSubset
		want          string // ready/notReady kept per subset
		wantTruncated bool
	}{
		{name: "under the cap", in: []corev1.EndpointSubset{{Addresses: addrs("a", 600), NotReadyAddresses: addrs("b", 400)}},
			want: "600/400"},
		{name: "ready first", in: []corev1.EndpointSubset{{Addresses: addrs("a", 1500), NotReadyAddresses: addrs("b", 10)}},
			want: "1000/0", wantTruncated: true},
		{name: "proportional across subsets", in: []corev1.EndpointSubset{{Addresses: addrs("a", 1500)}, {Addresses: addrs("b", 500)}},
			want: "750/0 250/0", wantTruncated: true},
		{name: "not-ready shares what ready leaves", in: []corev1.EndpointSubset{
			{Addresses: addrs("a", 700), NotReadyAddresses: addrs("b", 301)}, {NotReadyAddresses: addrs("c", 300)}},
			want: "700/151 0/149", wantTruncated: true},
		{name: "a subset left empty is dropped", in: []corev1.EndpointSubset{{Addresses: addrs("a", 1000)}, {NotReadyAddresses: addrs("c", 5)}},
			want: "1000/0", wantTruncated: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, truncated := truncateSubsets(tc.in)
			var got []string
			for _, ss := range out {
				got = append(got, fmt.Sprintf("%d/%d", len(ss.Addresses), len(ss.NotReadyAddresses)))
			}
			if strings.Join(got, " ") != tc.want || truncated != tc.wantTruncated {
				t.Errorf("got %v truncated=%v, want %s truncated=%v", got, truncated, tc.want, tc.wantTruncated)
			}
		})
	}
}

func TestRepackSubsets(t *testing.T) {
	addr := func(ip, uid string) corev1.EndpointAddress {
		return corev1.EndpointAddress{IP: ip, TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: uid, UID: types.UID(uid)}}
	}
	port := func(name string, n int32) []corev1.EndpointPort {
		return []corev1.EndpointPort{{Name: name, Port: n, Protocol: corev1.ProtocolTCP}}
	}
	in := []corev1.EndpointSubset{
		{Addresses: []corev1.EndpointAddress{addr("10.0.0.2", "b")}, Ports: port("http", 80)},
		{Addresses: []corev1.EndpointAddress{addr("10.0.0.1", "a")}, Ports: port("http", 80)},
		{NotReadyAddresses: []corev1.EndpointAddress{addr("10.0.0.1", "a")}, Ports: port("http", 80)}, // ready wins
		{Addresses: []corev1.EndpointAddress{addr("10.0.0.2", "b")}, Ports: port("admin", 81)},
		{Addresses: []corev1.EndpointAddress{addr("10.0.0.1", "a")}, Ports: port("dns", 53)},
		{Addresses: []corev1.EndpointAddress{addr("10.0.0.2", "b")}, Ports: port("dns", 53)},
		{NotReadyAddresses: []corev1.EndpointAddress{addr("10.0.0.3", "c")}, Ports: port("admin", 81)},
	}
	got := describeSubsets(repackSubsets(in))
	want := "[a,b||dns:53,http:80] [b|c|admin:81]"
	if got != want {
		t.Errorf("repacked %s, want %s", got, want)
	}
	// The order of the input does not matter.
	for i, j := 0, len(in)-1; i < j; i, j = i+1, j-1 {
		in[i], in[j] = in[j], in[i]
	}
	if again := describeSubsets(repackSubsets(in)); again != got {
		t.Errorf("reversed input repacked to %s, want %s", again, got)
	}
}

func TestEndpointsSelectorlessAndDeleted(t *testing.T) {
	manual := &corev1.Endpoints{ObjectMeta: metav1.ObjectMeta{Name: "ext", Namespace: epNamespace},
		Subsets: []corev1.EndpointSubset{{Addresses: []corev1.EndpointAddress{{IP: "192.0.2.1"}}, Ports: []corev1.EndpointPort{{Port: 443}}}}}
	h := newEndpointHarness(t, webService("ext", func(s *corev1.Service) { s.Spec.Selector = nil }), manual,
		webService("web"), webPod(1))
	if err := h.syncEndpoints(t, "ext"); err != nil {
		t.Fatal(err)
	}
	if got := h.storedEndpoints(t, "ext"); len(got.Subsets) != 1 || got.Subsets[0].Addresses[0].IP != "192.0.2.1" || got.Labels != nil {
		t.Errorf("a selectorless Service's Endpoints were changed: %+v", got)
	}

	if err := h.syncEndpoints(t, "web"); err != nil {
		t.Fatal(err)
	}
	h.storedEndpoints(t, "web")
	if err := h.kube.CoreV1().Services(epNamespace).Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the Service gone from the cache", func() bool {
		_, err := h.endpoints.services.Services(epNamespace).Get("web")
		return apierrors.IsNotFound(err)
	})
	if err := h.syncEndpoints(t, "web"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.kube.CoreV1().Endpoints(epNamespace).Get(context.Background(), "web", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Endpoints of a deleted Service: %v, want NotFound", err)
	}
}

func TestEndpointsFailureEvent(t *testing.T) {
	h := newEndpointHarness(t, webService("web"), webPod(1))
	h.kube.PrependReactor("create", "endpoints", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(corev1.Resource("endpoints"), "web", fmt.Errorf("no"))
	})
	if err := h.endpoints.sync(context.Background(), "default/web"); err == nil {
		t.Fatal("sync succeeded despite the refused create")
	}
	select {
	case ev := <-h.recorder.Events:
		if !strings.HasPrefix(ev, "Warning FailedToCreateEndpoint Failed to create endpoint for service default/web") {
			t.Errorf("event %q", ev)
		}
	default:
		t.Error("no event recorded")
	}
}
