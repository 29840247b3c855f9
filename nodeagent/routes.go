package nodeagent

import (
	"context"

	"github.com/skiff-dev/skiff/internal/podroutes"
)

// podCIDRsUser is a runtime that wants every Node's pod CIDR (the containerd runtime's masquerade).
type podCIDRsUser interface {
	setPodCIDRs(ctx context.Context, sorted []string, recheck bool)
}

// syncPodRoutes routes every other Node's pod CIDR via that Node's InternalIP (package podroutes), so that
// pods on different nodes of one L2 network reach each other; the runtime hears of every pod CIDR too, to
// exempt pod-to-pod traffic from masquerade.
func (a *Agent) syncPodRoutes(ctx context.Context) {
	o := podroutes.Options{Client: a.client, Logger: a.logger, Addr: a.cfg.AdvertiseAddr, Local: func(node string) bool { return a.nodes[node] }}
	if masq, ok := a.runtime.(podCIDRsUser); ok {
		o.PodCIDRs = masq.setPodCIDRs
	}
	podroutes.Sync(ctx, o)
}
