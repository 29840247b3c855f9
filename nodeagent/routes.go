package nodeagent

import (
	"context"
	"net"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// podCIDRsUser is a runtime that wants every Node's pod CIDR (the containerd runtime's masquerade).
type podCIDRsUser interface {
	setPodCIDRs(ctx context.Context, sorted []string, recheck bool)
}

// syncPodRoutes routes every other Node's pod CIDR via that Node's InternalIP, as flannel's host-gw mode
// does, so that pods on different nodes of one L2 network reach each other. It follows the Node objects:
// a route appears when a Node registers and goes when it is deleted. Only routes it made are removed. The
// runtime hears of every pod CIDR too, to exempt pod-to-pod traffic from masquerade.
func (a *Agent) syncPodRoutes(ctx context.Context) {
	factory := informers.NewSharedInformerFactory(a.client, 0)
	nodes := factory.Core().V1().Nodes()
	kick := make(chan struct{}, 1)
	notify := func(any) {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	nodes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: notify, UpdateFunc: func(_, o any) { notify(o) }, DeleteFunc: notify})
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), nodes.Informer().HasSynced) {
		return
	}
	routed := map[string]string{} // pod CIDR → gateway, as programmed
	masq, _ := a.runtime.(podCIDRsUser)
	recheck := false
	for {
		want := map[string]string{}
		podCIDRs := []string{} // never nil: nil tells the runtime the Node list is not known yet
		list, _ := nodes.Lister().List(labels.Everything())
		for _, n := range list {
			// Only IPv4 CIDRs reach iptables: one bad value would fail the whole chain's restore.
			if _, ipn, err := net.ParseCIDR(n.Spec.PodCIDR); err == nil && ipn.IP.To4() != nil {
				podCIDRs = append(podCIDRs, ipn.String())
			}
			if a.nodes[n.Name] || n.Spec.PodCIDR == "" {
				continue
			}
			for _, addr := range n.Status.Addresses {
				if addr.Type == corev1.NodeInternalIP && addr.Address != a.cfg.AdvertiseAddr && net.ParseIP(addr.Address) != nil {
					want[n.Spec.PodCIDR] = addr.Address
				}
			}
		}
		// Before the routes: a new Node's pods must not be reachable while still masqueraded towards.
		if masq != nil {
			sort.Strings(podCIDRs)
			masq.setPodCIDRs(ctx, slices.Compact(podCIDRs), recheck)
		}
		for cidr, via := range want {
			if routed[cidr] == via {
				continue
			}
			if out, err := exec.CommandContext(ctx, "ip", "route", "replace", cidr, "via", via).CombinedOutput(); err != nil {
				a.logger.Warn("routing a node's pod CIDR", "cidr", cidr, "via", via, "error", strings.TrimSpace(string(out)))
				continue
			}
			routed[cidr] = via
			a.logger.Info("routing pod CIDR", "cidr", cidr, "via", via)
		}
		for cidr, via := range routed {
			if want[cidr] == "" {
				_ = exec.CommandContext(ctx, "ip", "route", "del", cidr, "via", via).Run()
				delete(routed, cidr)
			}
		}
		recheck = false
		select {
		case <-ctx.Done():
			return
		case <-kick:
		case <-time.After(time.Minute): // routes and masquerade rules someone else removed come back
			recheck = true
		}
	}
}
