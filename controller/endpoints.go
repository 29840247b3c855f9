package controller

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/endpointslice"
	endpointsliceutil "k8s.io/endpointslice/util"
	netutils "k8s.io/utils/net"
)

// maxEndpointsAddresses is the most addresses (ready and not) one Endpoints object holds, as in Kubernetes:
// past it the object is truncated and annotated over-capacity, and clients that need every endpoint read
// the EndpointSlices.
const maxEndpointsAddresses = 1000

const (
	// endpointsManagedByLabel and endpointsControllerName mark the Endpoints this controller writes, as
	// Kubernetes (1.33 on) marks its own: the API server skips its IP warnings for them, and users can tell
	// them from hand-written ones.
	endpointsManagedByLabel = "endpoints.kubernetes.io/managed-by"
	endpointsControllerName = "endpoint-controller"
)

// endpointsController keeps the core/v1 Endpoints of every Service with a selector in step with its pods,
// as Kubernetes' endpoints controller does, for clients older than EndpointSlices (and `kubectl describe
// service`). The service proxy and DNS read EndpointSlices, not these.
type endpointsController struct {
	kube         kubernetes.Interface
	services     corelisters.ServiceLister
	pods         corelisters.PodLister
	endpoints    corelisters.EndpointsLister
	triggerTimes *endpointsliceutil.TriggerTimeTracker
	queue        *serviceQueue
	recorder     record.EventRecorder
	logger       hclog.Logger
}

// buildEndpointsController builds the controller that reconciles Endpoints. It is queued as the EndpointSlice controller is (Service
// events at once, pod events paced by serviceSyncInterval unless they take an endpoint out of service), and
// also when an Endpoints object it should own is deleted. Each sync of a Service goes:
//  1. a Service that is gone: delete its Endpoints;
//  2. a Service without a selector, or an ExternalName: leave its Endpoints alone (they are the user's, or
//     the API server's for default/kubernetes);
//  3. compute the subsets from the selected pods (see endpointSubsets), packed as Kubernetes packs them and
//     truncated to maxEndpointsAddresses;
//  4. create or update the Endpoints when the subsets, labels or over-capacity annotation differ.
func buildEndpointsController(ctx context.Context, c *Clients) (func(), error) {
	e, synced := newEndpointsController(c)
	return func() { e.queue.runWhenSynced(ctx, c, synced, e.logger, e.sync) }, nil
}

// newEndpointsController builds the controller and registers its informer handlers; it returns what must
// have synced before the first sync.
func newEndpointsController(c *Clients) (*endpointsController, []cache.InformerSynced) {
	services := c.Informers.Core().V1().Services()
	pods := c.Informers.Core().V1().Pods()
	endpoints := c.Informers.Core().V1().Endpoints()
	e := &endpointsController{
		kube:         c.Kube,
		services:     services.Lister(),
		pods:         pods.Lister(),
		endpoints:    endpoints.Lister(),
		triggerTimes: endpointsliceutil.NewTriggerTimeTracker(),
		queue:        newServiceQueue(serviceSyncInterval),
		recorder:     c.recorderFor("endpoint-controller"),
		logger:       c.Logger.Named("endpoints"),
	}
	services.Informer().AddEventHandler(serviceEventHandler(e.queue))
	pods.Informer().AddEventHandler(podEventHandler(e.services, e.queue))
	endpoints.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		// Deleted by someone else: write it again if its Service still selects pods.
		DeleteFunc: func(obj any) {
			ep, ok := fromTombstone[*corev1.Endpoints](obj)
			if !ok {
				return
			}
			if svc, err := e.services.Services(ep.Namespace).Get(ep.Name); err == nil && selectsPods(svc) {
				e.queue.add(ep.Namespace + "/" + ep.Name)
			}
		},
	})
	return e, []cache.InformerSynced{services.Informer().HasSynced, pods.Informer().HasSynced, endpoints.Informer().HasSynced}
}

// sync reconciles one Service's Endpoints (the steps are in runEndpointsController's comment).
func (e *endpointsController) sync(ctx context.Context, key string) error {
	namespace, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	svc, err := e.services.Services(namespace).Get(name)
	if apierrors.IsNotFound(err) {
		e.triggerTimes.DeleteService(namespace, name)
		err := e.kube.CoreV1().Endpoints(namespace).Delete(ctx, name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		e.queue.forget(key)
		return nil
	}
	if err != nil {
		return err
	}
	if !selectsPods(svc) {
		return nil
	}
	pods, err := e.pods.Pods(namespace).List(labels.Set(svc.Spec.Selector).AsSelectorPreValidated())
	if err != nil {
		return err
	}
	trigger := e.triggerTimes.ComputeEndpointLastChangeTriggerTime(namespace, svc, pods)
	subsets, truncated := truncateSubsets(repackSubsets(endpointSubsets(svc, pods)))

	current, err := e.endpoints.Endpoints(namespace).Get(name)
	create := apierrors.IsNotFound(err)
	if create {
		current = &corev1.Endpoints{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
	} else if err != nil {
		return err
	}
	wantLabels := endpointsLabels(svc)
	_, wasTruncated := current.Annotations[corev1.EndpointsOverCapacity]
	// The trigger time alone is no reason to write: it describes a change, and there is none to publish.
	if !create && truncated == wasTruncated && apiequality.Semantic.DeepEqual(current.Labels, wantLabels) &&
		subsetsEqual(current.Subsets, subsets) {
		return nil
	}

	next := current.DeepCopy()
	next.Subsets = subsets
	next.Labels = wantLabels
	if next.Annotations == nil {
		next.Annotations = map[string]string{}
	}
	if trigger.IsZero() {
		delete(next.Annotations, corev1.EndpointsLastChangeTriggerTime)
	} else {
		next.Annotations[corev1.EndpointsLastChangeTriggerTime] = trigger.UTC().Format(time.RFC3339Nano)
	}
	if truncated {
		next.Annotations[corev1.EndpointsOverCapacity] = "truncated"
	} else {
		delete(next.Annotations, corev1.EndpointsOverCapacity)
	}
	if len(next.Annotations) == 0 {
		next.Annotations = nil
	}

	client := e.kube.CoreV1().Endpoints(namespace)
	if create {
		_, err = client.Create(ctx, next, metav1.CreateOptions{})
	} else {
		_, err = client.Update(ctx, next, metav1.UpdateOptions{})
	}
	if err == nil {
		return nil
	}
	if create && apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause) {
		return nil // every create fails until the namespace is gone, and then the Service is gone too
	}
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
		return err // the cache is behind; the retry reads the newer object, no event needed
	}
	if create {
		e.recorder.Eventf(svc, corev1.EventTypeWarning, "FailedToCreateEndpoint", "Failed to create endpoint for service %s/%s: %v", namespace, name, err)
	} else {
		e.recorder.Eventf(svc, corev1.EventTypeWarning, "FailedToUpdateEndpoint", "Failed to update endpoint %s/%s: %v", namespace, name, err)
	}
	return err
}

// endpointsLabels are the labels the Endpoints of a Service carry: the Service's own, the headless marker
// for a Service without a cluster IP (DNS and proxies read it), the managed-by mark, and skip-mirror, which
// tells an EndpointSlice mirroring controller that these Endpoints are derived from a selector and already
// have their slices.
func endpointsLabels(svc *corev1.Service) map[string]string {
	out := maps.Clone(svc.Labels)
	if out == nil {
		out = map[string]string{}
	}
	if svc.Spec.ClusterIP == corev1.ClusterIPNone || svc.Spec.ClusterIP == "" {
		out[corev1.IsHeadlessService] = ""
	} else {
		delete(out, corev1.IsHeadlessService)
	}
	out[endpointsManagedByLabel] = endpointsControllerName
	out[discoveryv1.LabelSkipMirror] = "true"
	return out
}

// endpointSubsets turns the pods a Service selects into one single-address subset per pod (and port), to be
// packed by repackSubsets. As in Kubernetes:
//   - pods that finished, have no IP, or are terminating are left out, unless publishNotReadyAddresses keeps
//     terminating ones;
//   - a pod is a ready address if it is Ready (or publishNotReadyAddresses), a not-ready one otherwise;
//   - the address is the pod's IP of the Service's family, with nodeName and a targetRef to the pod, and a
//     hostname when the pod names the Service as its subdomain;
//   - each Service port gets the pod's port: a named targetPort is looked up among the pod's container
//     ports, and a pod without it is left out of that port only;
//   - a headless Service without ports gets portless addresses.
func endpointSubsets(svc *corev1.Service, pods []*corev1.Pod) []corev1.EndpointSubset {
	publish := svc.Spec.PublishNotReadyAddresses
	var subsets []corev1.EndpointSubset
	for _, pod := range pods {
		if !endpointsliceutil.ShouldPodBeInEndpoints(pod, publish) {
			continue
		}
		ip := podIPForService(svc, pod)
		if ip == "" {
			continue // no IP of the Service's family
		}
		addr := corev1.EndpointAddress{
			IP:        ip,
			NodeName:  &pod.Spec.NodeName,
			TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
		}
		if endpointsliceutil.ShouldSetHostname(pod, svc) {
			addr.Hostname = pod.Spec.Hostname
		}
		ready := publish || endpointsliceutil.IsPodReady(pod)
		subset := func(ports []corev1.EndpointPort) corev1.EndpointSubset {
			if ready {
				return corev1.EndpointSubset{Addresses: []corev1.EndpointAddress{addr}, Ports: ports}
			}
			return corev1.EndpointSubset{NotReadyAddresses: []corev1.EndpointAddress{addr}, Ports: ports}
		}
		if len(svc.Spec.Ports) == 0 {
			if svc.Spec.ClusterIP == corev1.ClusterIPNone {
				subsets = append(subsets, subset(nil))
			}
			continue
		}
		for i := range svc.Spec.Ports {
			sp := &svc.Spec.Ports[i]
			port, err := endpointslice.FindPort(pod, sp)
			if err != nil {
				continue
			}
			subsets = append(subsets, subset([]corev1.EndpointPort{{
				Name: sp.Name, Port: int32(port), Protocol: sp.Protocol, AppProtocol: sp.AppProtocol,
			}}))
		}
	}
	return subsets
}

// podIPForService picks the pod's IP of the Service's IP family: the family of its cluster IP, or for a
// headless Service its first ipFamilies entry, or (neither set) the family of the pod's primary IP.
func podIPForService(svc *corev1.Service, pod *corev1.Pod) string {
	var ips []string
	for _, ip := range pod.Status.PodIPs {
		ips = append(ips, ip.IP)
	}
	if len(ips) == 0 && pod.Status.PodIP != "" {
		ips = []string{pod.Status.PodIP}
	}
	if len(ips) == 0 {
		return ""
	}
	var wantV6 bool
	switch {
	case svc.Spec.ClusterIP != "" && svc.Spec.ClusterIP != corev1.ClusterIPNone:
		wantV6 = netutils.IsIPv6String(svc.Spec.ClusterIP)
	case len(svc.Spec.IPFamilies) > 0:
		wantV6 = svc.Spec.IPFamilies[0] == corev1.IPv6Protocol
	default:
		wantV6 = netutils.IsIPv6String(ips[0])
	}
	for _, ip := range ips {
		if netutils.IsIPv6String(ip) == wantV6 {
			return ip
		}
	}
	return ""
}

// repackSubsets regroups subsets the way Kubernetes' endpoints.RepackSubsets does, so that clients see the
// same shape: each port maps to the set of addresses that serve it, and ports whose address sets are equal
// (readiness included) share one subset. An address ready for a port in one input subset and not ready in
// another counts as ready. Addresses are sorted by IP (then pod UID), ports by name, number and protocol,
// subsets by their address sets, so the result does not depend on the input order and an unchanged Service
// compares equal to what is stored.
func repackSubsets(subsets []corev1.EndpointSubset) []corev1.EndpointSubset {
	type portAddrs struct {
		port  corev1.EndpointPort
		ready map[string]bool // address key -> ready
	}
	addrs := map[string]corev1.EndpointAddress{}
	ports := map[string]*portAddrs{}
	note := func(addr corev1.EndpointAddress, port corev1.EndpointPort, ready bool) {
		ak := addressKey(addr)
		if _, ok := addrs[ak]; !ok {
			addrs[ak] = addr
		}
		pk := portKey(port)
		pa := ports[pk]
		if pa == nil {
			pa = &portAddrs{port: port, ready: map[string]bool{}}
			ports[pk] = pa
		}
		pa.ready[ak] = pa.ready[ak] || ready
	}
	// noPort stands for "no ports" (a headless Service without any), so that such addresses are kept.
	noPort := corev1.EndpointPort{Port: -1}
	for _, ss := range subsets {
		subsetPorts := ss.Ports
		if len(subsetPorts) == 0 {
			subsetPorts = []corev1.EndpointPort{noPort}
		}
		for _, port := range subsetPorts {
			for _, a := range ss.Addresses {
				note(a, port, true)
			}
			for _, a := range ss.NotReadyAddresses {
				note(a, port, false)
			}
		}
	}

	// Group the ports by the address set (with readiness) they map to.
	type group struct {
		signature string
		ready     map[string]bool
		ports     []corev1.EndpointPort
	}
	groups := map[string]*group{}
	for _, pa := range ports {
		keys := slices.Sorted(maps.Keys(pa.ready))
		var sig strings.Builder
		for _, k := range keys {
			fmt.Fprintf(&sig, "%s=%t;", k, pa.ready[k])
		}
		g := groups[sig.String()]
		if g == nil {
			g = &group{signature: sig.String(), ready: pa.ready}
			groups[g.signature] = g
		}
		if pa.port != noPort {
			g.ports = append(g.ports, pa.port)
		}
	}

	var out []corev1.EndpointSubset
	for _, g := range groups {
		var ss corev1.EndpointSubset
		for k, ready := range g.ready {
			if ready {
				ss.Addresses = append(ss.Addresses, addrs[k])
			} else {
				ss.NotReadyAddresses = append(ss.NotReadyAddresses, addrs[k])
			}
		}
		slices.SortFunc(ss.Addresses, compareAddresses)
		slices.SortFunc(ss.NotReadyAddresses, compareAddresses)
		slices.SortFunc(g.ports, func(a, b corev1.EndpointPort) int { return strings.Compare(portKey(a), portKey(b)) })
		ss.Ports = g.ports
		out = append(out, ss)
	}
	slices.SortFunc(out, func(a, b corev1.EndpointSubset) int { return strings.Compare(subsetKey(a), subsetKey(b)) })
	return out
}

// addressKey identifies an address by IP and pod, so that two pods that held the same IP in turn are kept
// apart.
func addressKey(a corev1.EndpointAddress) string {
	if a.TargetRef != nil {
		return a.IP + "/" + string(a.TargetRef.UID)
	}
	return a.IP + "/"
}

func compareAddresses(a, b corev1.EndpointAddress) int {
	return strings.Compare(addressKey(a), addressKey(b))
}

// portKey identifies an endpoint port by every field, the appProtocol included.
func portKey(p corev1.EndpointPort) string {
	app := "-"
	if p.AppProtocol != nil {
		app = "=" + *p.AppProtocol
	}
	return fmt.Sprintf("%s/%011d/%s/%s", p.Name, p.Port, p.Protocol, app)
}

// subsetKey orders packed subsets: by their first address, ready ones before not-ready ones.
func subsetKey(ss corev1.EndpointSubset) string {
	var b strings.Builder
	for _, a := range ss.Addresses {
		b.WriteString("r" + addressKey(a) + ";")
	}
	for _, a := range ss.NotReadyAddresses {
		b.WriteString("n" + addressKey(a) + ";")
	}
	for _, p := range ss.Ports {
		b.WriteString(portKey(p) + ";")
	}
	return b.String()
}

// truncateSubsets keeps at most maxEndpointsAddresses addresses, and says whether it dropped any. Ready
// addresses are kept before not-ready ones; each subset keeps a share of the kept addresses in proportion to
// its size, so that every port keeps serving. Subsets left with no address are dropped (the API refuses
// them).
func truncateSubsets(subsets []corev1.EndpointSubset) ([]corev1.EndpointSubset, bool) {
	readySizes := make([]int, len(subsets))
	notReadySizes := make([]int, len(subsets))
	var ready, notReady int
	for i, ss := range subsets {
		readySizes[i], notReadySizes[i] = len(ss.Addresses), len(ss.NotReadyAddresses)
		ready += readySizes[i]
		notReady += notReadySizes[i]
	}
	if ready+notReady <= maxEndpointsAddresses {
		return subsets, false
	}
	keepReady := min(ready, maxEndpointsAddresses)
	readyShares := proportionalShares(readySizes, keepReady)
	notReadyShares := proportionalShares(notReadySizes, maxEndpointsAddresses-keepReady)
	var out []corev1.EndpointSubset
	for i, ss := range subsets {
		ss.Addresses = ss.Addresses[:readyShares[i]]
		ss.NotReadyAddresses = ss.NotReadyAddresses[:notReadyShares[i]]
		if len(ss.Addresses) == 0 {
			ss.Addresses = nil
		}
		if len(ss.NotReadyAddresses) == 0 {
			ss.NotReadyAddresses = nil
		}
		if ss.Addresses != nil || ss.NotReadyAddresses != nil {
			out = append(out, ss)
		}
	}
	return out, true
}

// proportionalShares splits keep (at most the sum of sizes) among the sizes in proportion, rounding down,
// and hands what rounding left over to the first that still have room.
func proportionalShares(sizes []int, keep int) []int {
	total := 0
	for _, s := range sizes {
		total += s
	}
	shares := make([]int, len(sizes))
	if total == 0 {
		return shares
	}
	given := 0
	for i, s := range sizes {
		shares[i] = s * keep / total
		given += shares[i]
	}
	for i := 0; given < keep && i < len(sizes); i++ {
		extra := min(sizes[i]-shares[i], keep-given)
		shares[i] += extra
		given += extra
	}
	return shares
}

// subsetsEqual compares subsets ignoring the resourceVersion in target references, which older writers put
// there and which changes with every pod status update.
func subsetsEqual(a, b []corev1.EndpointSubset) bool {
	return apiequality.Semantic.DeepEqual(withoutRefVersions(a), withoutRefVersions(b))
}

func withoutRefVersions(subsets []corev1.EndpointSubset) []corev1.EndpointSubset {
	out := make([]corev1.EndpointSubset, len(subsets))
	strip := func(addrs []corev1.EndpointAddress) []corev1.EndpointAddress {
		var cleared []corev1.EndpointAddress
		for _, a := range addrs {
			if a.TargetRef != nil && a.TargetRef.ResourceVersion != "" {
				ref := *a.TargetRef
				ref.ResourceVersion = ""
				a.TargetRef = &ref
			}
			cleared = append(cleared, a)
		}
		return cleared
	}
	for i, ss := range subsets {
		out[i] = corev1.EndpointSubset{Addresses: strip(ss.Addresses), NotReadyAddresses: strip(ss.NotReadyAddresses), Ports: ss.Ports}
	}
	return out
}
