package controller

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/skiff-dev/skiff/internal/lbpool"
)

// LoadBalancerConfig is what the load balancer address controller needs besides the API: the servers'
// pools, and the claims that give an address to one Service at a time across leader changes.
type LoadBalancerConfig struct {
	Pools  lbpool.Pools
	Claims AddressClaims
}

// AddressClaims are addresses that at most one holder (a Service's UID) has at a time: a claim is a write
// through Raft that fails when another holder has the address, so two leaders, or a leader acting on a stale
// cache, can never give one address twice.
type AddressClaims interface {
	// Claim gives ip to holder; taken says another holder has it.
	Claim(ctx context.Context, ip, holder string) (taken bool, err error)
	// Release frees ip if holder has it.
	Release(ctx context.Context, ip, holder string) error
	// Holders are every claimed address with its holder, as this server's store has them.
	Holders() map[string]string
}

// loadBalancerRetry is how soon a Service that got no address (its pool full) is looked at again; a Service
// that gives one up requeues every waiting Service at once.
const loadBalancerRetry = 30 * time.Second

// buildLoadBalancerController builds the controller that gives LoadBalancer Services their addresses, as a
// cloud's service controller or MetalLB's does, from the pools of the servers' `load_balancer` block. A
// Service of type LoadBalancer with no loadBalancerClass gets one address from its pool (the
// skiff.dev/load-balancer-pool annotation, else the default pool), or the one spec.loadBalancerIP asks for,
// written to status.loadBalancer.ingress; the agents' proxies then route it, and one node announces it. A
// full pool is a warning event on the Service, which gets an address once one is free. A Service that
// stops being one of Skiff's load balancers (deleted, another type, another class) gives its address back.
// With no pools the controller does not run: LoadBalancer Services stay pending, for another controller.
func buildLoadBalancerController(ctx context.Context, c *Clients) (func(), error) {
	cfg := c.LoadBalancer
	if len(cfg.Pools) == 0 || cfg.Claims == nil {
		return nil, nil
	}
	services := c.Informers.Core().V1().Services()
	lb := &loadBalancerAllocator{c: c, cfg: cfg, services: services.Lister(), recorder: c.recorderFor("service-controller")}
	lb.queue = newKeyQueue(queueConfig{what: "service", logger: c.Logger.Named("loadbalancer"), sync: lb.sync})
	lb.released = func() {
		for _, key := range lb.waitingKeys() {
			lb.queue.add(key)
		}
	}
	// A deleted Service's addresses are released by the sweep, which knows the UIDs; a deletion runs it at
	// once, rather than at its next tick, and the Services waiting for an address are synced after it.
	sweepNow := make(chan struct{}, 1)
	kickSweep := func() {
		select {
		case sweepNow <- struct{}{}:
		default:
		}
	}
	services.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: lb.queue.addObject,
		// A Service that stops being a load balancer of Skiff's gives its address up in its own sync
		// (giveUp), which then syncs the waiting Services.
		UpdateFunc: func(_, obj any) { lb.queue.addObject(obj) },
		DeleteFunc: func(obj any) {
			lb.queue.addObject(obj)
			kickSweep()
		},
	})
	return func() {
		go lb.sweep(ctx, services.Informer().HasSynced, sweepNow)
		lb.queue.run(ctx, c, services.Informer().HasSynced)
	}, nil
}

type loadBalancerAllocator struct {
	c        *Clients
	cfg      LoadBalancerConfig
	services corev1listers.ServiceLister
	recorder record.EventRecorder
	queue    *keyQueue
	released func() // addresses were released: sync the Services waiting for one
}

// ownedLoadBalancer tells whether Skiff gives the Service its address: a LoadBalancer without a class.
func ownedLoadBalancer(svc *corev1.Service) bool {
	return svc.Spec.Type == corev1.ServiceTypeLoadBalancer && svc.Spec.LoadBalancerClass == nil
}

// waitingKeys are the Services of Skiff's that have no address yet.
func (lb *loadBalancerAllocator) waitingKeys() []string {
	all, _ := lb.services.List(labels.Everything())
	var keys []string
	for _, svc := range all {
		if ownedLoadBalancer(svc) && len(svc.Status.LoadBalancer.Ingress) == 0 {
			keys = append(keys, svc.Namespace+"/"+svc.Name)
		}
	}
	return keys
}

func (lb *loadBalancerAllocator) sync(ctx context.Context, key string) (time.Duration, error) {
	namespace, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return 0, nil
	}
	svc, err := lb.services.Services(namespace).Get(name)
	if apierrors.IsNotFound(err) {
		return 0, nil // its claims go in the sweep, which knows the UIDs
	}
	if err != nil {
		return 0, err
	}
	held := lb.heldBy(string(svc.UID))
	if !ownedLoadBalancer(svc) {
		return 0, lb.giveUp(ctx, svc, held)
	}
	// The address it has, if it is still this Service's and in a pool it may use.
	want, pool, reason := lb.request(svc)
	if reason != "" {
		lb.recorder.Event(svc, corev1.EventTypeWarning, "AllocationFailed", reason)
		return 0, lb.giveUp(ctx, svc, held)
	}
	for _, ip := range held {
		if lb.fits(ip, want, pool) {
			return 0, lb.publish(ctx, svc, ip)
		}
	}
	ip, err := lb.claim(ctx, svc, want, pool)
	if err != nil {
		return 0, err
	}
	if ip == "" {
		return loadBalancerRetry, nil
	}
	for _, old := range held {
		if err := lb.cfg.Claims.Release(ctx, old, string(svc.UID)); err != nil {
			return 0, err
		}
	}
	if err := lb.publish(ctx, svc, ip); err != nil {
		return 0, err
	}
	lb.recorder.Eventf(svc, corev1.EventTypeNormal, "IPAllocated", "Assigned IP %s from pool %s", ip, pool)
	return 0, nil
}

// request is what the Service asks for: an address (spec.loadBalancerIP) or none, and a pool; reason says
// why it cannot be served.
func (lb *loadBalancerAllocator) request(svc *corev1.Service) (want netip.Addr, pool, reason string) {
	pool = lbpool.DefaultPool
	if p, ok := svc.Annotations[lbpool.PoolAnnotation]; ok {
		pool = p
	}
	if _, ok := lb.cfg.Pools.Pool(pool); !ok {
		return want, pool, fmt.Sprintf("no load balancer pool %q (the servers have %v)", pool, lb.cfg.Pools.Names())
	}
	if svc.Spec.LoadBalancerIP == "" {
		return want, pool, ""
	}
	want, err := netip.ParseAddr(svc.Spec.LoadBalancerIP)
	if err != nil {
		return want, pool, fmt.Sprintf("spec.loadBalancerIP %q is not an IP address", svc.Spec.LoadBalancerIP)
	}
	in, ok := lb.cfg.Pools.PoolOf(want)
	if !ok {
		return want, pool, fmt.Sprintf("spec.loadBalancerIP %s is in no load balancer pool", want)
	}
	if _, named := svc.Annotations[lbpool.PoolAnnotation]; named && in != pool {
		return want, pool, fmt.Sprintf("spec.loadBalancerIP %s is in pool %q, not %q", want, in, pool)
	}
	return want, in, ""
}

// fits tells whether an address the Service holds is what it asks for now.
func (lb *loadBalancerAllocator) fits(ip string, want netip.Addr, pool string) bool {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return false
	}
	if want.IsValid() {
		return a == want
	}
	in, ok := lb.cfg.Pools.PoolOf(a)
	return ok && in == pool
}

// claim takes the wanted address, or the pool's first free one; "" when there is none (an event says so).
func (lb *loadBalancerAllocator) claim(ctx context.Context, svc *corev1.Service, want netip.Addr, pool string) (string, error) {
	holder := string(svc.UID)
	if want.IsValid() {
		taken, err := lb.cfg.Claims.Claim(ctx, want.String(), holder)
		if err != nil || !taken {
			return want.String(), err
		}
		lb.recorder.Eventf(svc, corev1.EventTypeWarning, "AllocationFailed", "spec.loadBalancerIP %s is taken by another Service", want)
		return "", nil
	}
	holders := lb.cfg.Claims.Holders()
	p, _ := lb.cfg.Pools.Pool(pool)
	var got string
	var claimErr error
	p.Each(func(a netip.Addr) bool {
		if _, held := holders[a.String()]; held {
			return true
		}
		taken, err := lb.cfg.Claims.Claim(ctx, a.String(), holder)
		if err != nil {
			claimErr = err
			return false
		}
		if !taken {
			got = a.String()
			return false
		}
		return true
	})
	if claimErr != nil || got != "" {
		return got, claimErr
	}
	lb.recorder.Eventf(svc, corev1.EventTypeWarning, "AllocationFailed", "no free address in load balancer pool %q", pool)
	return "", nil
}

// heldBy lists the addresses a holder has, in order.
func (lb *loadBalancerAllocator) heldBy(holder string) []string {
	var out []string
	for ip, h := range lb.cfg.Claims.Holders() {
		if h == holder {
			out = append(out, ip)
		}
	}
	slices.Sort(out)
	return out
}

// publish writes the address as the Service's only load balancer ingress, unless it is so already.
func (lb *loadBalancerAllocator) publish(ctx context.Context, svc *corev1.Service, ip string) error {
	ingress := svc.Status.LoadBalancer.Ingress
	if len(ingress) == 1 && ingress[0].IP == ip && ingress[0].Hostname == "" {
		return nil
	}
	vip := corev1.LoadBalancerIPModeVIP
	updated := svc.DeepCopy()
	updated.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: ip, IPMode: &vip}}
	_, err := lb.c.Kube.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{})
	return err
}

// giveUp releases what a Service holds and takes its addresses out of its status; a Service that has
// another load balancer (a class of its own) keeps the status that one writes.
func (lb *loadBalancerAllocator) giveUp(ctx context.Context, svc *corev1.Service, held []string) error {
	if len(held) == 0 {
		return nil
	}
	var kept []corev1.LoadBalancerIngress
	for _, in := range svc.Status.LoadBalancer.Ingress {
		if !slices.Contains(held, in.IP) {
			kept = append(kept, in)
		}
	}
	if len(kept) != len(svc.Status.LoadBalancer.Ingress) {
		updated := svc.DeepCopy()
		updated.Status.LoadBalancer.Ingress = kept
		if _, err := lb.c.Kube.CoreV1().Services(svc.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{}); err != nil {
			return err
		}
	}
	var errs []error
	for _, ip := range held {
		errs = append(errs, lb.cfg.Claims.Release(ctx, ip, string(svc.UID)))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	lb.released()
	return nil
}

// sweep releases, every loadBalancerRetry and at once on a kick (a Service deleted), the addresses whose
// holder is no Service of Skiff's any more (one deleted while no leader watched, say), and syncs the waiting
// Services when it freed any. A claim is made only for a Service the informer has, so a claim whose UID the synced
// informer lacks is a deleted Service's.
func (lb *loadBalancerAllocator) sweep(ctx context.Context, synced cache.InformerSynced, kick <-chan struct{}) {
	if !cache.WaitForCacheSync(ctx.Done(), synced) {
		return
	}
	t := time.NewTicker(loadBalancerRetry)
	defer t.Stop()
	for {
		all, _ := lb.services.List(labels.Everything())
		live := map[string]bool{}
		for _, svc := range all {
			live[string(svc.UID)] = true
		}
		freed := false
		for ip, holder := range lb.cfg.Claims.Holders() {
			if _, known := live[holder]; known {
				continue // a Service that is no load balancer of Skiff's any more gives it up in its sync
			}
			if err := lb.cfg.Claims.Release(ctx, ip, holder); err != nil {
				if ctx.Err() == nil {
					lb.c.Logger.Warn("releasing the load balancer address of a deleted Service", "ip", ip, "error", err)
				}
				continue
			}
			freed = true
		}
		if freed {
			lb.released()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-kick:
		}
	}
}
