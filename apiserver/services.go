package apiserver

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	genericregistry "k8s.io/apiserver/pkg/registry/generic/registry"
	"k8s.io/apiserver/pkg/registry/rest"
	"k8s.io/apiserver/pkg/storage/names"
	"k8s.io/utils/ptr"

	"github.com/skiff-dev/skiff/apiserver/raftstore"
	"github.com/skiff-dev/skiff/internal/lbpool"
)

// Service addresses are allocated when a Service is created, safely across peers and leader changes:
//   - a ClusterIP is held by an IPAddress object named after the address (networking.k8s.io/v1, the design
//     of recent Kubernetes): creating it fails if another Service holds the address;
//   - a NodePort is held by a store key created with the store's Create, which fails the same way.
// Both are released when the Service is deleted, or when its creation fails.

const (
	nodePortMin    = 30000
	nodePortMax    = 32767
	nodePortPrefix = storagePrefix + "/skiff/nodeports/"
	// loadBalancerPrefix holds the load balancer addresses Services have (LoadBalancerClaims).
	loadBalancerPrefix = storagePrefix + "/skiff/lbaddresses/"
)

// DefaultServiceCIDR is where ClusterIPs come from unless service_cidr says otherwise.
const DefaultServiceCIDR = "10.96.0.0/16"

type serviceREST struct {
	*resource
	ips       *genericregistry.Store
	cidrs     *genericregistry.Store // ServiceCIDRs: more ranges beside cidr (allocationRanges)
	cidr      *net.IPNet             // the servers' service_cidr, the default ServiceCIDR's
	nodePorts *raftstore.Claims      // by port number, holder "namespace/name"
	lbPools   lbpool.Pools
}

// checkLoadBalancer refuses what the servers' load balancer pools cannot give a LoadBalancer Service of
// Skiff's (no loadBalancerClass): a pool they do not have, or an address (spec.loadBalancerIP) in none of
// them or in another pool than the one named. Without pools nothing is checked: another controller may own
// the Service's load balancer.
func (r *serviceREST) checkLoadBalancer(svc *corev1.Service) error {
	if len(r.lbPools) == 0 || svc.Spec.Type != corev1.ServiceTypeLoadBalancer || svc.Spec.LoadBalancerClass != nil {
		return nil
	}
	var errs field.ErrorList
	pool, named := svc.Annotations[lbpool.PoolAnnotation]
	if _, ok := r.lbPools.Pool(pool); named && !ok {
		errs = append(errs, field.NotSupported(field.NewPath("metadata", "annotations").Key(lbpool.PoolAnnotation), pool, r.lbPools.Names()))
	}
	if ip := svc.Spec.LoadBalancerIP; ip != "" {
		path := field.NewPath("spec", "loadBalancerIP")
		addr, err := netip.ParseAddr(ip)
		in, ok := r.lbPools.PoolOf(addr)
		switch {
		case err != nil:
			errs = append(errs, field.Invalid(path, ip, "must be a valid IP address"))
		case !ok:
			errs = append(errs, field.Invalid(path, ip, fmt.Sprintf("is in no load balancer pool of the servers' (%v)", r.lbPools.Names())))
		case named && in != pool:
			errs = append(errs, field.Invalid(path, ip, fmt.Sprintf("is in load balancer pool %q, not in %q", in, pool)))
		}
	}
	if len(errs) > 0 {
		return apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Service").GroupKind(), svc.Name, errs)
	}
	return nil
}

// loadBalancerRequestChanged tells whether an update changes what checkLoadBalancer looks at: a Service
// made before the pools changed may still be updated otherwise.
func loadBalancerRequestChanged(svc, old *corev1.Service) bool {
	return svc.Spec.Type != old.Spec.Type || svc.Spec.LoadBalancerIP != old.Spec.LoadBalancerIP ||
		!ptr.Equal(svc.Spec.LoadBalancerClass, old.Spec.LoadBalancerClass) ||
		svc.Annotations[lbpool.PoolAnnotation] != old.Annotations[lbpool.PoolAnnotation]
}

// allocation is what one Service holds, so a failed create can give it back.
type allocation struct {
	ip     string
	ports  []int32
	holder string // namespace/name
}

func (r *serviceREST) Create(ctx context.Context, obj runtime.Object, createValidation rest.ValidateObjectFunc, options *metav1.CreateOptions) (runtime.Object, error) {
	svc := obj.(*corev1.Service)
	if options != nil && len(options.DryRun) > 0 {
		if needsHealthCheckNodePort(svc) && svc.Spec.HealthCheckNodePort == 0 {
			// What a real create would get, not held: kube-apiserver's dry-run allocator does the same.
			svc.Spec.HealthCheckNodePort = nodePortMin + rand.Int32N(nodePortMax-nodePortMin+1)
		}
		return r.resource.Create(ctx, obj, createValidation, options)
	}
	// The ClusterIP's IPAddress names its Service: a generated name is chosen before the allocation, as
	// kube-apiserver's store chooses it before its create hooks run.
	if svc.Name == "" && svc.GenerateName != "" {
		svc.Name = names.SimpleNameGenerator.GenerateName(svc.GenerateName)
	}
	if err := r.checkLoadBalancer(svc); err != nil {
		return nil, err
	}
	alloc, err := r.allocate(ctx, svc)
	if err != nil {
		return nil, err
	}
	out, err := r.resource.Create(ctx, obj, createValidation, options)
	if err != nil {
		r.release(ctx, alloc)
	}
	return out, err
}

func (r *serviceREST) Delete(ctx context.Context, name string, deleteValidation rest.ValidateObjectFunc, options *metav1.DeleteOptions) (runtime.Object, bool, error) {
	// The store answers a delete with a Status, not the object: read what the Service holds first. Its
	// ClusterIP cannot change, so the read cannot go stale in a way that matters.
	existing, err := r.resource.Get(ctx, name, &metav1.GetOptions{})
	if err != nil {
		return nil, false, err
	}
	out, immediate, err := r.resource.Delete(ctx, name, deleteValidation, options)
	if err == nil && (options == nil || len(options.DryRun) == 0) {
		r.release(ctx, allocationOf(existing.(*corev1.Service)))
	}
	return out, immediate, err
}

func allocationOf(svc *corev1.Service) allocation {
	a := allocation{holder: svc.Namespace + "/" + svc.Name}
	if ip := svc.Spec.ClusterIP; ip != "" && ip != corev1.ClusterIPNone {
		a.ip = ip
	}
	for _, p := range svc.Spec.Ports {
		if p.NodePort != 0 {
			a.ports = append(a.ports, p.NodePort)
		}
	}
	if svc.Spec.HealthCheckNodePort != 0 {
		a.ports = append(a.ports, svc.Spec.HealthCheckNodePort)
	}
	return a
}

// needsHealthCheckNodePort tells whether a Service gets a health check node port: a LoadBalancer Service
// with externalTrafficPolicy Local, whose load balancer asks each node's proxy, on that port, whether the node
// has a ready endpoint of it (nodeagent/proxy). It is taken from the NodePort range and held as NodePorts are.
func needsHealthCheckNodePort(svc *corev1.Service) bool {
	return svc.Spec.Type == corev1.ServiceTypeLoadBalancer && svc.Spec.ExternalTrafficPolicy == corev1.ServiceExternalTrafficPolicyLocal
}

// claimHealthCheckNodePort claims the port a Service asks for as spec.healthCheckNodePort, or allocates one.
func (r *serviceREST) claimHealthCheckNodePort(ctx context.Context, svc *corev1.Service) (int32, error) {
	port := svc.Spec.HealthCheckNodePort
	if port == 0 {
		return r.allocatePort(ctx, svc)
	}
	path := field.NewPath("spec", "healthCheckNodePort")
	invalid := func(msg string) error {
		return apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Service").GroupKind(), svc.Name, field.ErrorList{field.Invalid(path, port, msg)})
	}
	if port < nodePortMin || port > nodePortMax {
		return 0, invalid(fmt.Sprintf("provided port is not in the valid range. The range of valid ports is %d-%d", nodePortMin, nodePortMax))
	}
	if err := r.claimPort(ctx, port, svc); err != nil {
		if errors.Is(err, raftstore.ErrClaimed) {
			return 0, invalid("provided port is already allocated")
		}
		return 0, err
	}
	return port, nil
}

func (r *serviceREST) allocate(ctx context.Context, svc *corev1.Service) (allocation, error) {
	a := allocation{holder: svc.Namespace + "/" + svc.Name}
	invalid := func(path *field.Path, value interface{}, msg string) error {
		return apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Service").GroupKind(), svc.Name, field.ErrorList{field.Invalid(path, value, msg)})
	}
	if svc.Spec.Type != corev1.ServiceTypeExternalName && svc.Spec.ClusterIP != corev1.ClusterIPNone {
		ip, err := r.allocateIPFor(ctx, svc)
		if err != nil {
			return a, err
		}
		a.ip = ip
		setClusterIP(svc, ip)
	}
	if hasNodePorts(svc) {
		for i := range svc.Spec.Ports {
			p := &svc.Spec.Ports[i]
			path := field.NewPath("spec", "ports").Index(i).Child("nodePort")
			if p.NodePort != 0 {
				if p.NodePort < nodePortMin || p.NodePort > nodePortMax {
					r.release(ctx, a)
					return allocation{}, invalid(path, p.NodePort, fmt.Sprintf("provided port is not in the valid range. The range of valid ports is %d-%d", nodePortMin, nodePortMax))
				}
				if err := r.claimPort(ctx, p.NodePort, svc); err != nil {
					r.release(ctx, a)
					if errors.Is(err, raftstore.ErrClaimed) {
						return allocation{}, invalid(path, p.NodePort, "provided port is already allocated")
					}
					return allocation{}, err
				}
			} else if allocatesNodePorts(svc) {
				port, err := r.allocatePort(ctx, svc)
				if err != nil {
					r.release(ctx, a)
					return allocation{}, err
				}
				p.NodePort = port
			} else {
				continue
			}
			a.ports = append(a.ports, p.NodePort)
		}
	}
	if needsHealthCheckNodePort(svc) {
		port, err := r.claimHealthCheckNodePort(ctx, svc)
		if err != nil {
			r.release(ctx, a)
			return allocation{}, err
		}
		svc.Spec.HealthCheckNodePort = port
		a.ports = append(a.ports, port)
	}
	return a, nil
}

// allocateIPFor claims the cluster IP the Service asks for, or a free one.
func (r *serviceREST) allocateIPFor(ctx context.Context, svc *corev1.Service) (string, error) {
	if svc.Spec.ClusterIP == "" {
		return r.allocateIP(ctx, svc)
	}
	invalid := func(msg string) error {
		return apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Service").GroupKind(), svc.Name,
			field.ErrorList{field.Invalid(field.NewPath("spec", "clusterIPs").Index(0), svc.Spec.ClusterIP, msg)})
	}
	ip := net.ParseIP(svc.Spec.ClusterIP)
	ranges, err := r.allocationRanges(ctx)
	if err != nil {
		return "", err
	}
	if ip == nil || !slices.ContainsFunc(ranges, func(n *net.IPNet) bool { return n.Contains(ip) }) {
		var valid []string
		for _, n := range ranges {
			valid = append(valid, n.String())
		}
		return "", invalid(fmt.Sprintf("failed to allocate IP %s: the provided IP (%s) is not in the valid range. The range of valid IPs is %s",
			svc.Spec.ClusterIP, svc.Spec.ClusterIP, strings.Join(valid, ",")))
	}
	if err := r.claimIP(ctx, ip.String(), svc); err != nil {
		if apierrors.IsAlreadyExists(err) {
			return "", invalid(fmt.Sprintf("failed to allocate IP %s: provided IP is already allocated", svc.Spec.ClusterIP))
		}
		return "", err
	}
	return ip.String(), nil
}

// setClusterIP writes an allocated IPv4 cluster IP into the Service, single stack.
func setClusterIP(svc *corev1.Service, ip string) {
	single := corev1.IPFamilyPolicySingleStack
	svc.Spec.ClusterIP, svc.Spec.ClusterIPs = ip, []string{ip}
	svc.Spec.IPFamilyPolicy, svc.Spec.IPFamilies = &single, []corev1.IPFamily{corev1.IPv4Protocol}
}

// allocationRanges are the ranges ClusterIPs come from, as kube-apiserver's MultiCIDRServiceAllocator takes
// them: the servers' service_cidr (the default ServiceCIDR "kubernetes") first, then the IPv4 range of every
// other ServiceCIDR that is Ready (the servicecidrs controller says so) and not being deleted, by name. A
// Service gets an address of a later range only when the earlier ones are full.
func (r *serviceREST) allocationRanges(ctx context.Context) ([]*net.IPNet, error) {
	ranges := []*net.IPNet{r.cidr}
	if r.cidrs == nil {
		return ranges, nil
	}
	obj, err := r.cidrs.List(genericapirequest.WithNamespace(ctx, ""), &metainternalversion.ListOptions{})
	if err != nil {
		return nil, err
	}
	list := obj.(*networkingv1.ServiceCIDRList).Items
	slices.SortFunc(list, func(a, b networkingv1.ServiceCIDR) int { return strings.Compare(a.Name, b.Name) })
	for _, c := range list {
		if c.DeletionTimestamp != nil || !meta.IsStatusConditionTrue(c.Status.Conditions, networkingv1.ServiceCIDRConditionReady) {
			continue
		}
		for _, s := range c.Spec.CIDRs {
			_, n, err := net.ParseCIDR(s)
			if err != nil || n.IP.To4() == nil || slices.ContainsFunc(ranges, func(o *net.IPNet) bool { return o.String() == n.String() }) {
				continue
			}
			ranges = append(ranges, n)
		}
	}
	return ranges, nil
}

// allocateIP claims a free address of the first range that has one, trying each from a random offset so that
// concurrent creates rarely collide. The network address, the broadcast address and, in the servers' own
// range, the first host address (the kubernetes Service's, by convention) are never handed out.
func (r *serviceREST) allocateIP(ctx context.Context, svc *corev1.Service) (string, error) {
	ranges, err := r.allocationRanges(ctx)
	if err != nil {
		return "", err
	}
	var names []string
	for _, n := range ranges {
		names = append(names, n.String())
		ip, err := r.allocateIPIn(ctx, svc, n, n == r.cidr)
		if err != nil || ip != "" {
			return ip, err
		}
	}
	return "", apierrors.NewInternalError(fmt.Errorf("no ClusterIP is free in %s", strings.Join(names, ", ")))
}

// allocateIPIn claims a free address of one range; "" when it has none.
func (r *serviceREST) allocateIPIn(ctx context.Context, svc *corev1.Service, cidr *net.IPNet, skipFirst bool) (string, error) {
	base := binary.BigEndian.Uint32(cidr.IP.To4())
	ones, bits := cidr.Mask.Size()
	size := uint32(1) << uint(bits-ones)
	first := uint32(1)
	if skipFirst {
		first = 2
	}
	if size < first+2 {
		return "", nil // no usable address
	}
	usable := size - first - 1 // skip the reserved low addresses and the broadcast address
	start := rand.Uint32N(usable)
	for i := uint32(0); i < usable; i++ {
		offset := first + (start+i)%usable
		ip := make(net.IP, 4)
		binary.BigEndian.PutUint32(ip, base+offset)
		err := r.claimIP(ctx, ip.String(), svc)
		if err == nil {
			return ip.String(), nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return "", err
		}
	}
	return "", nil
}

func (r *serviceREST) claimIP(ctx context.Context, ip string, svc *corev1.Service) error {
	obj := &networkingv1.IPAddress{
		ObjectMeta: metav1.ObjectMeta{Name: ip, Labels: map[string]string{"ipaddress.kubernetes.io/managed-by": "skiff-apiserver"}},
		Spec: networkingv1.IPAddressSpec{ParentRef: &networkingv1.ParentReference{
			Group: "", Resource: "services", Namespace: svc.Namespace, Name: svc.Name,
		}},
	}
	_, err := r.ips.Create(genericapirequest.WithNamespace(ctx, ""), obj, nil, &metav1.CreateOptions{})
	return err
}

func (r *serviceREST) allocatePort(ctx context.Context, svc *corev1.Service) (int32, error) {
	span := int32(nodePortMax - nodePortMin + 1)
	start := rand.Int32N(span)
	for i := int32(0); i < span; i++ {
		port := nodePortMin + (start+i)%span
		err := r.claimPort(ctx, port, svc)
		if err == nil {
			return port, nil
		}
		if !errors.Is(err, raftstore.ErrClaimed) {
			return 0, err
		}
	}
	return 0, apierrors.NewInternalError(errors.New("no NodePort is free"))
}

// claimPort claims a NodePort for the Service. A port the Service holds already counts as claimed by someone
// else here: a Service never lists one port twice, and an update claims only ports it did not have.
func (r *serviceREST) claimPort(ctx context.Context, port int32, svc *corev1.Service) error {
	created, err := r.nodePorts.Claim(ctx, strconv.Itoa(int(port)), svc.Namespace+"/"+svc.Name)
	if err == nil && !created {
		return &raftstore.ClaimedError{Name: strconv.Itoa(int(port)), Holder: svc.Namespace + "/" + svc.Name}
	}
	return err
}

func (r *serviceREST) release(ctx context.Context, a allocation) {
	if a.ip != "" {
		r.ips.Delete(genericapirequest.WithNamespace(ctx, ""), a.ip, rest.ValidateAllObjectFunc, &metav1.DeleteOptions{})
	}
	for _, p := range a.ports {
		_ = r.nodePorts.Release(ctx, strconv.Itoa(int(p)), a.holder) // a port left held is wasted, never shared
	}
}

// validateServiceUpdate keeps allocated addresses: a ClusterIP cannot change once set, unless the Service
// becomes an ExternalName one, which has none.
func validateServiceUpdate(o, old runtime.Object) field.ErrorList {
	svc, oldSvc := o.(*corev1.Service), old.(*corev1.Service)
	var errs field.ErrorList
	toExternalName := svc.Spec.Type == corev1.ServiceTypeExternalName && svc.Spec.ClusterIP == ""
	if oldSvc.Spec.ClusterIP != "" && svc.Spec.ClusterIP != oldSvc.Spec.ClusterIP && !toExternalName {
		errs = append(errs, field.Invalid(field.NewPath("spec", "clusterIPs").Index(0), svc.Spec.ClusterIP, "may not change once set"))
	}
	// A load balancer's class says which controller owns it; it cannot change hands while it is one.
	lb := corev1.ServiceTypeLoadBalancer
	if svc.Spec.Type == lb && oldSvc.Spec.Type == lb && !ptr.Equal(svc.Spec.LoadBalancerClass, oldSvc.Spec.LoadBalancerClass) {
		errs = append(errs, field.Invalid(field.NewPath("spec", "loadBalancerClass"), svc.Spec.LoadBalancerClass, "may not change once set"))
	}
	return errs
}

// prepareServiceUpdate carries the allocated addresses over when an update (an apply, say) leaves them out.
func prepareServiceUpdate(o, old runtime.Object) {
	svc, oldSvc := o.(*corev1.Service), old.(*corev1.Service)
	if svc.Spec.Type == corev1.ServiceTypeExternalName && oldSvc.Spec.Type != corev1.ServiceTypeExternalName {
		// Becoming an ExternalName Service drops the cluster IP the update left as it was, as Kubernetes'
		// strategy does; the IP is released once the update is stored.
		if svc.Spec.ClusterIP == oldSvc.Spec.ClusterIP {
			svc.Spec.ClusterIP, svc.Spec.ClusterIPs, svc.Spec.IPFamilies, svc.Spec.IPFamilyPolicy = "", nil, nil, nil
		}
	} else if svc.Spec.ClusterIP == "" {
		svc.Spec.ClusterIP = oldSvc.Spec.ClusterIP
		svc.Spec.ClusterIPs = oldSvc.Spec.ClusterIPs
		svc.Spec.IPFamilies = oldSvc.Spec.IPFamilies
		svc.Spec.IPFamilyPolicy = oldSvc.Spec.IPFamilyPolicy
	}
	if svc.Spec.HealthCheckNodePort == 0 && needsHealthCheckNodePort(svc) && needsHealthCheckNodePort(oldSvc) {
		svc.Spec.HealthCheckNodePort = oldSvc.Spec.HealthCheckNodePort
	}
	if !hasNodePorts(svc) {
		// Leaving NodePort drops what only NodePorts have, as Kubernetes does, unless the update sets it anew
		// (which validation then refuses).
		if hasNodePorts(oldSvc) && svc.Spec.ExternalTrafficPolicy == oldSvc.Spec.ExternalTrafficPolicy {
			svc.Spec.ExternalTrafficPolicy = ""
		}
		return
	}
	for i := range svc.Spec.Ports {
		if svc.Spec.Ports[i].NodePort == 0 && i < len(oldSvc.Spec.Ports) && oldSvc.Spec.Ports[i].Port == svc.Spec.Ports[i].Port {
			svc.Spec.Ports[i].NodePort = oldSvc.Spec.Ports[i].NodePort
		}
	}
}

// Update claims the NodePorts an update adds (a type changed to NodePort, a new port, a changed nodePort) and,
// once the update is stored, releases the ones it dropped; a failed update gives back what it claimed.
func (r *serviceREST) Update(ctx context.Context, name string, objInfo rest.UpdatedObjectInfo, createValidation rest.ValidateObjectFunc,
	updateValidation rest.ValidateObjectUpdateFunc, forceAllowCreate bool, options *metav1.UpdateOptions) (runtime.Object, bool, error) {
	if options != nil && len(options.DryRun) > 0 {
		return r.resource.Update(ctx, name, objInfo, createValidation, updateValidation, forceAllowCreate, options)
	}
	u := &nodePortUpdate{UpdatedObjectInfo: objInfo, r: r}
	out, created, err := r.resource.Update(ctx, name, u, createValidation, updateValidation, forceAllowCreate, options)
	keep := map[int32]bool{}
	if err == nil {
		for _, p := range out.(*corev1.Service).Spec.Ports {
			keep[p.NodePort] = true
		}
		keep[out.(*corev1.Service).Spec.HealthCheckNodePort] = true
	}
	free := allocation{holder: u.holder}
	if ip := u.claimedIP; ip != "" && (err != nil || out.(*corev1.Service).Spec.ClusterIP != ip) {
		free.ip = ip // allocated by an attempt that did not stick
	}
	if err == nil && u.old != nil && u.old.Spec.ClusterIP != out.(*corev1.Service).Spec.ClusterIP {
		if a := allocationOf(u.old); a.ip != "" {
			r.release(context.WithoutCancel(ctx), allocation{ip: a.ip, holder: u.holder}) // now an ExternalName Service
		}
	}
	for _, p := range u.claimed {
		if !keep[p] {
			free.ports = append(free.ports, p) // claimed by an attempt that did not stick
		}
	}
	if err == nil && u.old != nil {
		for _, p := range allocationOf(u.old).ports {
			if !keep[p] {
				free.ports = append(free.ports, p) // dropped by the update
			}
		}
	}
	r.release(context.WithoutCancel(ctx), free)
	return out, created, err
}

// nodePortUpdate wraps an update's new object: it carries the allocated addresses over and claims the NodePorts
// the new object needs. The store may call it more than once (conflict retries); every port it claims is
// remembered so that the ones the stored object does not keep are released.
type nodePortUpdate struct {
	rest.UpdatedObjectInfo
	r       *serviceREST
	holder  string
	old     *corev1.Service // the version the last attempt updated
	claimed []int32
	// claimedIP is the cluster IP allocated for a Service that stops being an ExternalName one.
	claimedIP string
}

func (u *nodePortUpdate) UpdatedObject(ctx context.Context, oldObj runtime.Object) (runtime.Object, error) {
	obj, err := u.UpdatedObjectInfo.UpdatedObject(ctx, oldObj)
	if err != nil {
		return nil, err
	}
	svc, old := obj.(*corev1.Service), oldObj.(*corev1.Service)
	u.holder, u.old = old.Namespace+"/"+old.Name, old
	prepareServiceUpdate(svc, old)
	if loadBalancerRequestChanged(svc, old) {
		if err := u.r.checkLoadBalancer(svc); err != nil {
			return nil, err
		}
	}
	if err := u.allocateClusterIP(ctx, svc, old); err != nil {
		return nil, err
	}
	if err := u.healthCheckNodePort(ctx, svc, old); err != nil {
		return nil, err
	}
	held := map[int32]bool{}
	for _, p := range old.Spec.Ports {
		held[p.NodePort] = p.NodePort != 0
	}
	if !hasNodePorts(svc) {
		// Leaving NodePort: the ports carried over are dropped, as Kubernetes does; a port the user sets
		// anew is left for validation to refuse.
		for i := range svc.Spec.Ports {
			if held[svc.Spec.Ports[i].NodePort] {
				svc.Spec.Ports[i].NodePort = 0
			}
		}
		return svc, nil
	}
	for i := range svc.Spec.Ports {
		p := &svc.Spec.Ports[i]
		if held[p.NodePort] {
			continue
		}
		if p.NodePort == 0 && !allocatesNodePorts(svc) {
			continue
		}
		if p.NodePort == 0 {
			port, err := u.r.allocatePort(ctx, svc)
			if err != nil {
				return nil, err
			}
			p.NodePort = port
			u.claimed = append(u.claimed, port)
			continue
		}
		path := field.NewPath("spec", "ports").Index(i).Child("nodePort")
		if p.NodePort < nodePortMin || p.NodePort > nodePortMax {
			return nil, apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Service").GroupKind(), svc.Name, field.ErrorList{
				field.Invalid(path, p.NodePort, fmt.Sprintf("provided port is not in the valid range. The range of valid ports is %d-%d", nodePortMin, nodePortMax))})
		}
		created, err := u.r.nodePorts.Claim(ctx, strconv.Itoa(int(p.NodePort)), u.holder)
		if errors.Is(err, raftstore.ErrClaimed) {
			return nil, apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Service").GroupKind(), svc.Name, field.ErrorList{
				field.Invalid(path, p.NodePort, "provided port is already allocated")})
		} else if err != nil {
			return nil, err
		}
		if created {
			u.claimed = append(u.claimed, p.NodePort)
		}
	}
	return svc, nil
}

// healthCheckNodePort gives an updated Service the health check node port it needs (kept from the old
// version, or claimed anew when it starts to need one), and drops the one it no longer needs, as
// kube-apiserver does; the port cannot change while the Service keeps needing it.
func (u *nodePortUpdate) healthCheckNodePort(ctx context.Context, svc, old *corev1.Service) error {
	oldPort := old.Spec.HealthCheckNodePort
	if !needsHealthCheckNodePort(svc) {
		if svc.Spec.HealthCheckNodePort == oldPort {
			svc.Spec.HealthCheckNodePort = 0 // released once the update is stored; a new value is validation's
		}
		return nil
	}
	if needsHealthCheckNodePort(old) && oldPort != 0 {
		if svc.Spec.HealthCheckNodePort != oldPort {
			return apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Service").GroupKind(), svc.Name, field.ErrorList{
				field.Invalid(field.NewPath("spec", "healthCheckNodePort"), svc.Spec.HealthCheckNodePort, "field is immutable")})
		}
		return nil
	}
	if slices.Contains(u.claimed, svc.Spec.HealthCheckNodePort) && svc.Spec.HealthCheckNodePort != 0 {
		return nil // this update's earlier attempt claimed it
	}
	port, err := u.r.claimHealthCheckNodePort(ctx, svc)
	if err != nil {
		return err
	}
	svc.Spec.HealthCheckNodePort = port
	u.claimed = append(u.claimed, port)
	return nil
}

// allocateClusterIP gives a cluster IP to a Service that stops being an ExternalName one, as on creation (the
// one the update asks for, or a free one). An attempt retried after a conflict keeps the IP it allocated.
func (u *nodePortUpdate) allocateClusterIP(ctx context.Context, svc, old *corev1.Service) error {
	if old.Spec.Type != corev1.ServiceTypeExternalName || svc.Spec.Type == corev1.ServiceTypeExternalName ||
		old.Spec.ClusterIP != "" || svc.Spec.ClusterIP == corev1.ClusterIPNone {
		return nil
	}
	if u.claimedIP != "" && (svc.Spec.ClusterIP == "" || svc.Spec.ClusterIP == u.claimedIP) {
		setClusterIP(svc, u.claimedIP)
		return nil
	}
	a, err := u.r.allocateIPFor(ctx, svc)
	if err != nil {
		return err
	}
	if u.claimedIP != "" {
		u.r.release(ctx, allocation{ip: u.claimedIP, holder: u.holder})
	}
	u.claimedIP = a
	setClusterIP(svc, a)
	return nil
}

func hasNodePorts(svc *corev1.Service) bool {
	return svc.Spec.Type == corev1.ServiceTypeNodePort || svc.Spec.Type == corev1.ServiceTypeLoadBalancer
}

// LoadBalancerClaims are the load balancer addresses of Services, claims in the store as NodePorts are: the
// leader's load balancer controller gives each address to one Service (holder: its UID) at a time.
func LoadBalancerClaims(b raftstore.Backend) *raftstore.Claims {
	return raftstore.NewClaims(b, loadBalancerPrefix)
}

// allocatesNodePorts tells whether ports without a nodePort get one: NodePort Services, and LoadBalancer ones
// unless allocateLoadBalancerNodePorts is false (a load balancer that sends traffic to the pods' IPs, or to
// its addresses on the nodes, needs none). Ports given one keep it either way.
func allocatesNodePorts(svc *corev1.Service) bool {
	a := svc.Spec.AllocateLoadBalancerNodePorts
	return svc.Spec.Type == corev1.ServiceTypeNodePort || (svc.Spec.Type == corev1.ServiceTypeLoadBalancer && (a == nil || *a))
}
