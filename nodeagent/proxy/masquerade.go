package proxy

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
)

// Pod egress masquerade. Kubernetes' network model has pods reach each other without NAT: a pod must see
// another node's pod connect from that pod's own IP. The CNI bridge plugin's ipMasq would SNAT everything
// leaving the node's own pod CIDR, other nodes' pods included, so it is off, and the agent keeps this rule
// set instead: traffic from the node's pod CIDR to any Node's pod CIDR keeps its source, and traffic to
// anywhere else (the internet, hosts) is masqueraded behind the node's address.
//
//	nat POSTROUTING: -s <node pod CIDR> -m comment --comment <owner> -j SKIFF-MASQ-<id>
//	SKIFF-MASQ-<id>: -m comment --comment <owner> (no target: it only names the owner, see ownership.go)
//	                 -m physdev --physdev-is-bridged -j RETURN (switched by a bridge, not routed here)
//	                 -d <each Node's pod CIDR> -j RETURN; -d 224.0.0.0/4 -j RETURN; -j MASQUERADE
//
// RETURN, not ACCEPT: the rest of POSTROUTING still applies, portmap's hairpin masquerade for hostPorts
// included. So does any masquerade rule of the host's own, and a pod wired before ipMasq was off keeps the
// bridge plugin's per-pod rule until it is recreated.
//
// The chain is per node agent (like its bridge), so two agents on one host keep separate rules. It outlives
// the agent process, as pods do; `skiff agent -teardown` (RemoveAll) removes it, and so does another agent
// that finds its owner dead (RemoveStale). It is written apart from the service rules because pod creation
// needs it before the proxy has synced, and the proxy may be disabled.

// masqueradeRules is the iptables-restore input that replaces the chain's rules atomically (--noflush leaves
// every other chain alone; declaring the chain empties it).
func masqueradeRules(chain, owner string, podCIDRs []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "*nat\n:%s - [0:0]\n", chain)
	fmt.Fprintf(&b, "-A %s %s\n", chain, commentArg(owner))
	// Only traffic this host routes: with br_netfilter, frames another bridge on the host switches between
	// its ports pass POSTROUTING too, and the source match alone took another cluster's pods with the same
	// pod CIDR (a `skiff local` beside a `skiff dev`) for this node's, and rewrote their cross-node traffic.
	fmt.Fprintf(&b, "-A %s -m physdev --physdev-is-bridged -j RETURN\n", chain)
	for _, cidr := range podCIDRs {
		fmt.Fprintf(&b, "-A %s -d %s -j RETURN\n", chain, cidr)
	}
	fmt.Fprintf(&b, "-A %s -d 224.0.0.0/4 -j RETURN\n", chain)
	fmt.Fprintf(&b, "-A %s -j MASQUERADE\n", chain)
	b.WriteString("COMMIT\n")
	return b.String()
}

// SyncMasquerade writes the chain with podCIDRs (every Node's, this node's included) exempt, then makes sure
// POSTROUTING sends the node's pod traffic to it. With keepExisting, a chain that exists already is left as it
// is: an agent that restarted and does not know the Node list yet keeps the previous run's exemptions. owner
// is the agent's OwnerComment; the caller holds its Claim.
func SyncMasquerade(ctx context.Context, chain, owner, nodePodCIDR string, podCIDRs []string, keepExisting bool) error {
	return syncMasquerade(ctx, Commands{}.withDefaults(), chain, owner, nodePodCIDR, podCIDRs, keepExisting)
}

func syncMasquerade(ctx context.Context, cmds Commands, chain, owner, nodePodCIDR string, podCIDRs []string, keepExisting bool) error {
	iptables := func(args ...string) *exec.Cmd {
		return exec.CommandContext(ctx, cmds.IPTables, append([]string{"-w", "5", "-t", "nat"}, args...)...)
	}
	exists := keepExisting && iptables("-S", chain).Run() == nil
	if !exists {
		if err := cmds.restore(ctx, []byte(masqueradeRules(chain, owner, podCIDRs))); err != nil {
			return fmt.Errorf("writing %s: %w", chain, err)
		}
	}
	jump := func(op string) *exec.Cmd {
		return iptables(op, "POSTROUTING", "-s", nodePodCIDR, "-m", "comment", "--comment", owner, "-j", chain)
	}
	var exit *exec.ExitError
	switch err := jump("-C").Run(); {
	case err == nil:
		return nil
	case !errors.As(err, &exit) || exit.ExitCode() != 1: // 1 is "no such rule"; a lock timeout is not
		return fmt.Errorf("checking the POSTROUTING jump to %s: %v", chain, err)
	}
	if out, err := jump("-A").CombinedOutput(); err != nil {
		return fmt.Errorf("adding the POSTROUTING jump to %s: %v: %s", chain, err, strings.TrimSpace(string(out)))
	}
	return nil
}
