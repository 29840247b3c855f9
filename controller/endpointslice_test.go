package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
)

const epNamespace = "default"

// endpointHarness runs both endpoint controllers' informers over a fake clientset, without their workers:
// tests call sync themselves, after waiting for the informers to show what the last sync wrote (as the
// tracker demands of the real loop).
type endpointHarness struct {
	kube      *fake.Clientset
	recorder  *record.FakeRecorder
	slices    *endpointSliceController
	endpoints *endpointsController
	cancel    context.CancelFunc
}

func newEndpointHarness(t *testing.T, objs ...runtime.Object) *endpointHarness {
	t.Helper()
	kube := fake.NewClientset(objs...)
	// The fake clientset does not generate names; the API server does.
	var generated atomic.Int64
	kube.PrependReactor("create", "*", func(action k8stesting.Action) (bool, runtime.Object, error) {
		obj := action.(k8stesting.CreateAction).GetObject().(metav1.Object)
		if obj.GetName() == "" && obj.GetGenerateName() != "" {
			obj.SetName(fmt.Sprintf("%s%05d", obj.GetGenerateName(), generated.Add(1)))
		}
		return false, nil, nil
	})
	recorder := record.NewFakeRecorder(100)
	c := &Clients{Kube: kube, Informers: informers.NewSharedInformerFactory(kube, 0), Recorder: recorder, Logger: hclog.NewNullLogger()}
	if err := addSharedIndexers(c.Informers); err != nil {
		t.Fatal(err)
	}
	es, synced := newEndpointSliceController(c)
	ep, synced2 := newEndpointsController(c)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c.Informers.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), append(synced, synced2...)...) {
		t.Fatal("informers did not sync")
	}
	// Every informer the factory started (addSharedIndexers starts some these controllers do not use) has
	// listed before a test adds reactors to the fake, which is not safe to change while it is listed.
	for typ, ok := range c.Informers.WaitForCacheSync(ctx.Done()) {
		if !ok {
			t.Fatalf("informer of %v did not sync", typ)
		}
	}
	t.Cleanup(func() { es.queue.shutDown(); ep.queue.shutDown() })
	return &endpointHarness{kube: kube, recorder: recorder, slices: es, endpoints: ep, cancel: cancel}
}

// eventually polls cond until it holds, for at most 5 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// storedSlices lists the Service's slices in the (fake) API.
func (h *endpointHarness) storedSlices(t *testing.T, service string) []discoveryv1.EndpointSlice {
	t.Helper()
	list, err := h.kube.DiscoveryV1().EndpointSlices(epNamespace).List(context.Background(),
		metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + service})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// syncSlices runs one EndpointSlice sync of the Service, then waits until the informer has caught up with
// the API, so that the next sync is not refused as stale.
func (h *endpointHarness) syncSlices(t *testing.T, service string) error {
	t.Helper()
	err := h.slices.sync(context.Background(), epNamespace+"/"+service)
	eventually(t, "the slice informer to catch up", func() bool {
		cached, _ := h.slices.slices.EndpointSlices(epNamespace).List(labels.Everything())
		stored, _ := h.kube.DiscoveryV1().EndpointSlices(epNamespace).List(context.Background(), metav1.ListOptions{})
		if len(cached) != len(stored.Items) {
			return false
		}
		versions := map[string]string{}
		for _, s := range stored.Items {
			versions[s.Name] = s.ResourceVersion
		}
		for _, s := range cached {
			if versions[s.Name] != s.ResourceVersion {
				return false
			}
		}
		return true
	})
	return err
}

// apply creates or updates objects in the API and waits until the informers show them.
func (h *endpointHarness) apply(t *testing.T, objs ...runtime.Object) {
	t.Helper()
	ctx := context.Background()
	for _, obj := range objs {
		var err error
		switch o := obj.(type) {
		case *corev1.Pod:
			// The fake API keeps resourceVersions as given; handlers take an unchanged one for a resync.
			o.ResourceVersion = fmt.Sprint(time.Now().UnixNano())
			_, err = h.kube.CoreV1().Pods(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				_, err = h.kube.CoreV1().Pods(o.Namespace).Update(ctx, o, metav1.UpdateOptions{})
			}
			eventually(t, "pod "+o.Name+" in the cache", func() bool {
				p, err := h.slices.pods.Pods(o.Namespace).Get(o.Name)
				return err == nil && p.Status.Phase == o.Status.Phase && (p.DeletionTimestamp == nil) == (o.DeletionTimestamp == nil) &&
					isPodReady(p) == isPodReady(o) && mapsEqual(p.Labels, o.Labels)
			})
		case *corev1.Service:
			_, err = h.kube.CoreV1().Services(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				_, err = h.kube.CoreV1().Services(o.Namespace).Update(ctx, o, metav1.UpdateOptions{})
			}
			eventually(t, "service "+o.Name+" in the cache", func() bool {
				s, err := h.slices.services.Services(o.Namespace).Get(o.Name)
				return err == nil && mapsEqual(s.Spec.Selector, o.Spec.Selector) && s.Spec.PublishNotReadyAddresses == o.Spec.PublishNotReadyAddresses
			})
		default:
			t.Fatalf("apply: unexpected %T", obj)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// webService selects app=web, with port 80 to the pods' port named "http".
func webService(name string, opts ...func(*corev1.Service)) *corev1.Service {
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: epNamespace, UID: types.UID("svc-" + name), Labels: map[string]string{"team": "a"}},
		Spec: corev1.ServiceSpec{
			Selector:   map[string]string{"app": "web"},
			ClusterIP:  "10.96.0.20",
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol},
			Ports:      []corev1.ServicePort{{Name: "web", Port: 80, Protocol: corev1.ProtocolTCP, TargetPort: intstr.FromString("http")}},
		},
	}
	for _, o := range opts {
		o(svc)
	}
	return svc
}

func publishNotReady(s *corev1.Service) { s.Spec.PublishNotReadyAddresses = true }

func headless(s *corev1.Service) { s.Spec.ClusterIP = corev1.ClusterIPNone }

// webPod is a running pod of app=web on node-a with IP 10.244.0.<n>, serving port "http" on 8080 and
// Ready; options change that.
func webPod(n int, opts ...func(*corev1.Pod)) *corev1.Pod {
	ip := fmt.Sprintf("10.244.%d.%d", n/250, n%250+1)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("web-%04d", n), Namespace: epNamespace, UID: types.UID(fmt.Sprintf("pod-%04d", n)),
			Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{NodeName: "node-a", Containers: []corev1.Container{{Name: "c",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}},
	}
	for _, o := range opts {
		o(pod)
	}
	return pod
}

func notReady(p *corev1.Pod) {
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse}}
}

func terminating(p *corev1.Pod) {
	now := metav1.Now()
	p.DeletionTimestamp = &now
	p.DeletionGracePeriodSeconds = ptrTo(int64(30))
}

func noIP(p *corev1.Pod) { p.Status.PodIP, p.Status.PodIPs = "", nil }

func httpPort(port int32) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Spec.Containers[0].Ports[0].ContainerPort = port }
}

func ptrTo[T any](v T) *T { return &v }

func zoneNode(name, zone string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelTopologyZone: zone}}}
}

// endpointsByPod maps each endpoint of the slices to its pod's name.
func endpointsByPod(items []discoveryv1.EndpointSlice) map[string]discoveryv1.Endpoint {
	out := map[string]discoveryv1.Endpoint{}
	for _, s := range items {
		for _, ep := range s.Endpoints {
			out[ep.TargetRef.Name] = ep
		}
	}
	return out
}

func conditions(ep discoveryv1.Endpoint) string {
	b := func(p *bool) string {
		if p == nil {
			return "nil"
		}
		return fmt.Sprint(*p)
	}
	return fmt.Sprintf("ready=%s serving=%s terminating=%s", b(ep.Conditions.Ready), b(ep.Conditions.Serving), b(ep.Conditions.Terminating))
}

func TestEndpointSliceConditions(t *testing.T) {
	cases := []struct {
		name    string
		service *corev1.Service
		want    map[string]string // pod -> conditions; pods not named must be absent
	}{
		{name: "default", service: webService("web"), want: map[string]string{
			"web-0001": "ready=true serving=true terminating=false",
			"web-0002": "ready=false serving=false terminating=false",
			"web-0003": "ready=false serving=true terminating=true",
			"web-0004": "ready=false serving=false terminating=true",
		}},
		{name: "publishNotReadyAddresses", service: webService("web", publishNotReady), want: map[string]string{
			"web-0001": "ready=true serving=true terminating=false",
			"web-0002": "ready=true serving=false terminating=false",
			"web-0003": "ready=true serving=true terminating=true",
			"web-0004": "ready=true serving=false terminating=true",
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newEndpointHarness(t, tc.service, zoneNode("node-a", "zone-1"),
				webPod(1), webPod(2, notReady), webPod(3, terminating), webPod(4, terminating, notReady),
				webPod(5, noIP), webPod(6, func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }),
				webPod(7, func(p *corev1.Pod) { p.Labels = map[string]string{"app": "other"} }))
			if err := h.syncSlices(t, "web"); err != nil {
				t.Fatal(err)
			}
			stored := h.storedSlices(t, "web")
			if len(stored) != 1 {
				t.Fatalf("%d slices, want 1", len(stored))
			}
			s := stored[0]
			if s.Labels[discoveryv1.LabelManagedBy] != "endpointslice-controller.k8s.io" || s.AddressType != discoveryv1.AddressTypeIPv4 ||
				!strings.HasPrefix(s.Name, "web-") {
				t.Errorf("slice %s: labels %v, addressType %s", s.Name, s.Labels, s.AddressType)
			}
			if ref := metav1.GetControllerOf(&s); ref == nil || ref.Kind != "Service" || ref.Name != "web" || ref.UID != tc.service.UID {
				t.Errorf("slice owner %+v, want the Service", ref)
			}
			if len(s.Ports) != 1 || *s.Ports[0].Name != "web" || *s.Ports[0].Port != 8080 || *s.Ports[0].Protocol != corev1.ProtocolTCP {
				t.Errorf("ports %+v, want web 8080/TCP (the named targetPort resolved)", s.Ports)
			}
			got := endpointsByPod(stored)
			for pod, want := range tc.want {
				ep, ok := got[pod]
				if !ok {
					t.Errorf("%s: no endpoint", pod)
					continue
				}
				if c := conditions(ep); c != want {
					t.Errorf("%s: %s, want %s", pod, c, want)
				}
				n := 0
				fmt.Sscanf(pod, "web-%d", &n)
				if ep.Addresses[0] != fmt.Sprintf("10.244.0.%d", n+1) || ep.NodeName == nil || *ep.NodeName != "node-a" ||
					ep.Zone == nil || *ep.Zone != "zone-1" || ep.TargetRef.Kind != "Pod" || ep.TargetRef.UID != types.UID(fmt.Sprintf("pod-%04d", n)) {
					t.Errorf("%s: endpoint %+v", pod, ep)
				}
			}
			if len(got) != len(tc.want) {
				t.Errorf("endpoints for %v, want only %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(tc.want)))
			}
		})
	}
}

// A pod whose deletion begins turns terminating (and not ready) in the next sync, and that sync is queued
// at once even right after another sync, as it is for a pod losing or gaining readiness, while ordinary
// churn waits for the interval.
func TestEndpointSliceTerminatingIsImmediate(t *testing.T) {
	h := newEndpointHarness(t, webService("web"), zoneNode("node-a", "z"), webPod(1), webPod(2))
	if err := h.syncSlices(t, "web"); err != nil {
		t.Fatal(err)
	}
	q := h.slices.queue
	q.mu.Lock()
	q.interval = time.Hour // any pacing would show as a missing key
	q.lastSync["default/web"] = time.Now()
	q.mu.Unlock()
	drain := func() {
		for q.queue.Len() > 0 {
			k, _ := q.queue.Get()
			q.queue.Done(k)
			q.queue.Forget(k)
		}
	}
	drain()

	// Ordinary churn (a new pod) is paced.
	h.apply(t, webPod(3))
	time.Sleep(50 * time.Millisecond)
	if n := q.queue.Len(); n != 0 {
		t.Fatalf("a new pod queued the Service at once (%d keys) within the interval", n)
	}

	// Deletion begins: queued at once.
	h.apply(t, webPod(1, terminating))
	eventually(t, "the Service to be queued", func() bool { return q.queue.Len() == 1 })
	drain()
	if err := h.syncSlices(t, "web"); err != nil {
		t.Fatal(err)
	}
	if c := conditions(endpointsByPod(h.storedSlices(t, "web"))["web-0001"]); c != "ready=false serving=true terminating=true" {
		t.Errorf("terminating pod: %s", c)
	}

	// Readiness lost: at once too.
	h.apply(t, webPod(2, notReady))
	eventually(t, "the Service to be queued", func() bool { return q.queue.Len() == 1 })
	drain()

	// Readiness gained: at once as well (a rollout waits for that capacity).
	h.apply(t, webPod(2))
	eventually(t, "the Service to be queued", func() bool { return q.queue.Len() == 1 })
}

// With a short interval, churn right after a sync is batched into one sync an interval later.
func TestServiceQueuePacing(t *testing.T) {
	q := newServiceQueue(200 * time.Millisecond)
	defer q.shutDown()
	q.add("ns/a")
	k, _ := q.queue.Get()
	q.lastSync[k] = time.Now()
	q.queue.Done(k)
	start := time.Now()
	for range 10 {
		q.addPaced("ns/a")
	}
	if q.queue.Len() != 0 {
		t.Fatal("paced adds came through within the interval")
	}
	k, _ = q.queue.Get()
	if waited := time.Since(start); k != "ns/a" || waited < 150*time.Millisecond || waited > time.Second {
		t.Fatalf("got %q after %v, want ns/a after about 200ms", k, waited)
	}
	q.queue.Done(k)
	if q.queue.Len() != 0 {
		t.Fatalf("%d more keys: the burst was not batched into one", q.queue.Len())
	}
	// A Service that has not synced lately goes at once.
	q.addPaced("ns/b")
	if q.queue.Len() != 1 {
		t.Fatal("a quiet Service was held back")
	}
}

// Each pod's named targetPort is resolved on its own containers: pods that put "http" on different ports
// end up in different slices.
func TestEndpointSliceNamedPortsPerPod(t *testing.T) {
	h := newEndpointHarness(t, webService("web"), zoneNode("node-a", "z"),
		webPod(1), webPod(2, httpPort(9090)), webPod(3, httpPort(9090)),
		webPod(4, func(p *corev1.Pod) { p.Spec.Containers[0].Ports = nil }))
	if err := h.syncSlices(t, "web"); err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, s := range h.storedSlices(t, "web") {
		port := "none"
		if len(s.Ports) > 0 {
			port = fmt.Sprint(*s.Ports[0].Port)
		}
		for _, ep := range s.Endpoints {
			got[port] = append(got[port], ep.TargetRef.Name)
		}
		slices.Sort(got[port])
	}
	want := map[string][]string{"8080": {"web-0001"}, "9090": {"web-0002", "web-0003"}, "none": {"web-0004"}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("endpoints by port %v, want %v", got, want)
	}
}

func TestEndpointSliceSplitsAt100(t *testing.T) {
	objs := []runtime.Object{webService("web"), zoneNode("node-a", "z")}
	for i := range 250 {
		objs = append(objs, webPod(i))
	}
	h := newEndpointHarness(t, objs...)
	if err := h.syncSlices(t, "web"); err != nil {
		t.Fatal(err)
	}
	stored := h.storedSlices(t, "web")
	total := 0
	for _, s := range stored {
		if len(s.Endpoints) > 100 {
			t.Errorf("slice %s has %d endpoints", s.Name, len(s.Endpoints))
		}
		total += len(s.Endpoints)
	}
	if len(stored) != 3 || total != 250 || len(endpointsByPod(stored)) != 250 {
		t.Errorf("%d slices with %d endpoints (%d pods), want 3 with 250", len(stored), total, len(endpointsByPod(stored)))
	}
	// A second sync with nothing changed writes nothing.
	before := len(h.kube.Actions())
	if err := h.syncSlices(t, "web"); err != nil {
		t.Fatal(err)
	}
	for _, a := range h.kube.Actions()[before:] {
		if a.GetVerb() != "list" && a.GetVerb() != "watch" {
			t.Errorf("unchanged Service: %s %s", a.GetVerb(), a.GetResource().Resource)
		}
	}
}

// userSlice is an EndpointSlice a user wrote for a Service.
func userSlice(service string) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: service + "-manual", Namespace: epNamespace,
			Labels: map[string]string{discoveryv1.LabelServiceName: service}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{"192.0.2.1"}}},
	}
}

func sliceNames(items []discoveryv1.EndpointSlice) []string {
	var names []string
	for _, s := range items {
		names = append(names, s.Name)
	}
	slices.Sort(names)
	return names
}

func TestEndpointSliceSelectorless(t *testing.T) {
	svc := webService("ext", func(s *corev1.Service) { s.Spec.Selector = nil })
	h := newEndpointHarness(t, svc, zoneNode("node-a", "z"), userSlice("ext"), webPod(1))
	if err := h.syncSlices(t, "ext"); err != nil {
		t.Fatal(err)
	}
	stored := h.storedSlices(t, "ext")
	if names := sliceNames(stored); fmt.Sprint(names) != "[ext-manual]" || len(stored[0].Endpoints) != 1 || stored[0].Endpoints[0].Addresses[0] != "192.0.2.1" {
		t.Errorf("slices of a selectorless Service: %v %+v", names, stored)
	}
}

// A Service that loses its selector loses its managed slices and keeps a user's; a deleted Service loses
// its managed slices.
func TestEndpointSliceSelectorRemovedAndServiceDeleted(t *testing.T) {
	h := newEndpointHarness(t, webService("web"), zoneNode("node-a", "z"), webPod(1), userSlice("web"))
	if err := h.syncSlices(t, "web"); err != nil {
		t.Fatal(err)
	}
	if n := len(h.storedSlices(t, "web")); n != 2 {
		t.Fatalf("%d slices, want the managed one and the user's", n)
	}
	h.apply(t, webService("web", func(s *corev1.Service) { s.Spec.Selector = nil }))
	if err := h.syncSlices(t, "web"); err != nil {
		t.Fatal(err)
	}
	if names := sliceNames(h.storedSlices(t, "web")); fmt.Sprint(names) != "[web-manual]" {
		t.Errorf("after the selector went: %v, want the user's only", names)
	}

	// Back with a selector, then deleted.
	h.apply(t, webService("web"))
	if err := h.syncSlices(t, "web"); err != nil {
		t.Fatal(err)
	}
	if n := len(h.storedSlices(t, "web")); n != 2 {
		t.Fatalf("%d slices, want 2", n)
	}
	if err := h.kube.CoreV1().Services(epNamespace).Delete(context.Background(), "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the Service gone from the cache", func() bool {
		_, err := h.slices.services.Services(epNamespace).Get("web")
		return apierrors.IsNotFound(err)
	})
	if err := h.syncSlices(t, "web"); err != nil {
		t.Fatal(err)
	}
	if names := sliceNames(h.storedSlices(t, "web")); fmt.Sprint(names) != "[web-manual]" {
		t.Errorf("after the Service was deleted: %v, want the user's only", names)
	}
}

// A refused write fails the sync (so it is retried) and is reported on the Service.
func TestEndpointSliceFailureEvent(t *testing.T) {
	h := newEndpointHarness(t, webService("web"), zoneNode("node-a", "z"), webPod(1))
	h.kube.PrependReactor("create", "endpointslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(discoveryv1.Resource("endpointslices"), "", fmt.Errorf("quota"))
	})
	if err := h.syncSlices(t, "web"); err == nil {
		t.Fatal("sync succeeded despite the refused create")
	}
	select {
	case ev := <-h.recorder.Events:
		if !strings.HasPrefix(ev, "Warning FailedToUpdateEndpointSlices Error updating Endpoint Slices for Service default/web:") {
			t.Errorf("event %q", ev)
		}
	default:
		t.Error("no event recorded")
	}
}

// The tracker refuses to reconcile from a cache that has not seen the controller's own writes.
func TestEndpointSliceStaleCache(t *testing.T) {
	h := newEndpointHarness(t, webService("web"), zoneNode("node-a", "z"), webPod(1))
	if err := h.slices.sync(context.Background(), "default/web"); err != nil {
		t.Fatal(err)
	}
	// The informer may already have caught up; then there is nothing to test.
	if cached, _ := h.slices.slices.EndpointSlices(epNamespace).List(managedSliceSelector("web")); len(cached) == 0 {
		err := h.slices.sync(context.Background(), "default/web")
		// The informer may also catch up between that look and the sync; only a sync that saw the stale
		// cache and went on is wrong.
		caughtUp, _ := h.slices.slices.EndpointSlices(epNamespace).List(managedSliceSelector("web"))
		if err != errStaleSlices && len(caughtUp) == 0 {
			t.Errorf("sync on a stale cache: %v, want errStaleSlices", err)
		}
	}
	eventually(t, "the cache to catch up", func() bool {
		cached, _ := h.slices.slices.EndpointSlices(epNamespace).List(managedSliceSelector("web"))
		return len(cached) == 1
	})
	if err := h.slices.sync(context.Background(), "default/web"); err != nil {
		t.Fatal(err)
	}
	if n := len(h.storedSlices(t, "web")); n != 1 {
		t.Errorf("%d slices, want 1 (no duplicate from a stale cache)", n)
	}
}

// A sync that fails only because the informer is behind is retried on the short "behind" backoff, not the
// one-second failure backoff; any other failure takes the failure backoff.
func TestServiceQueueRetriesAStaleCacheSoon(t *testing.T) {
	q := newServiceQueue(time.Second)
	defer q.shutDown()
	errs := []error{errStaleSlices, errors.New("boom"), nil}
	q.add("ns/a")
	var i int
	q.setSync(hclog.NewNullLogger(), func(context.Context, string) error { return errs[i] })
	for i = range errs {
		if !q.processNext(context.Background()) {
			t.Fatal("queue shut down")
		}
		switch i {
		case 0:
			if q.retryBehind.NumRequeues("ns/a") != 1 || q.queue.NumRequeues("ns/a") != 0 {
				t.Fatalf("stale cache: behind %d, failures %d", q.retryBehind.NumRequeues("ns/a"), q.queue.NumRequeues("ns/a"))
			}
		case 1:
			if q.queue.NumRequeues("ns/a") != 1 {
				t.Fatalf("an error: failures %d", q.queue.NumRequeues("ns/a"))
			}
		case 2:
			if q.retryBehind.NumRequeues("ns/a") != 0 || q.queue.NumRequeues("ns/a") != 0 {
				t.Fatal("a success did not reset the backoffs")
			}
		}
		if i < 2 {
			eventually(t, "the retry", func() bool { return q.queue.Len() == 1 })
		}
	}
}
