// Package podroutes routes every Node's pod CIDR through that Node's InternalIP, as flannel's host-gw mode
// does, so that a host on the nodes' L2 network reaches pods on every node: node agents, so that pods reach
// each other, and servers (server { route_pod_cidrs = true }), so that the API reaches the pods it calls:
// admission and conversion webhooks, and the extension API servers behind APIServices.
package podroutes

import (
	"context"
	"net"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/skiff-dev/skiff/internal/cachetransform"
)

// Options say whose routes a host keeps.
type Options struct {
	Client kubernetes.Interface
	Logger hclog.Logger
	// Local tells the Nodes this host is (an agent's own): no route to their pod CIDRs.
	Local func(node string) bool
	// Addr is this host's own address: no route goes via it.
	Addr string
	// PodCIDRs, when set, hears every Node's IPv4 pod CIDR (sorted, never nil) before the routes change, and
	// again every minute with recheck set (the agent's masquerade exemptions).
	PodCIDRs func(ctx context.Context, sorted []string, recheck bool)
}

// Sync keeps the routes until ctx ends, following the Node objects: a route appears when a Node registers
// and goes when it is deleted. Only routes it made are removed; every minute it puts back what someone else
// removed.
func Sync(ctx context.Context, o Options) {
	factory := informers.NewSharedInformerFactoryWithOptions(o.Client, 0, informers.WithTransform(cachetransform.StripManagedFields))
	nodes := factory.Core().V1().Nodes()
	kick := make(chan struct{}, 1)
	notify := func(any) {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	_, _ = nodes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: notify, UpdateFunc: func(_, o any) { notify(o) }, DeleteFunc: notify})
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), nodes.Informer().HasSynced) {
		return
	}
	routed := map[string]string{} // pod CIDR → gateway, as programmed
	defer func() {
		if o.Local == nil { // a server's routes go with it; an agent's stay for its pods, which outlive it
			for cidr, via := range routed {
				_ = exec.Command("ip", "route", "del", cidr, "via", via).Run()
			}
		}
	}()
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
			if (o.Local != nil && o.Local(n.Name)) || n.Spec.PodCIDR == "" {
				continue
			}
			for _, addr := range n.Status.Addresses {
				if addr.Type == corev1.NodeInternalIP && addr.Address != o.Addr && net.ParseIP(addr.Address) != nil {
					want[n.Spec.PodCIDR] = addr.Address
				}
			}
		}
		// Before the routes: a new Node's pods must not be reachable while still masqueraded towards.
		if o.PodCIDRs != nil {
			sort.Strings(podCIDRs)
			o.PodCIDRs(ctx, slices.Compact(podCIDRs), recheck)
		}
		for cidr, via := range want {
			if routed[cidr] == via && !recheck {
				continue
			}
			if out, err := exec.CommandContext(ctx, "ip", "route", "replace", cidr, "via", via).CombinedOutput(); err != nil {
				o.Logger.Warn("routing a node's pod CIDR", "cidr", cidr, "via", via, "error", strings.TrimSpace(string(out)))
				continue
			}
			if routed[cidr] != via {
				o.Logger.Info("routing pod CIDR", "cidr", cidr, "via", via)
			}
			routed[cidr] = via
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
