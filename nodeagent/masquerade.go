package nodeagent

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
//	nat POSTROUTING: -s <node pod CIDR> -j SKIFF-MASQ-<id>
//	SKIFF-MASQ-<id>: -d <each Node's pod CIDR> -j RETURN; -d 224.0.0.0/4 -j RETURN; -j MASQUERADE
//
// RETURN, not ACCEPT: the rest of POSTROUTING still applies, portmap's hairpin masquerade for hostPorts
// included. So does any masquerade rule of the host's own, and a pod wired before ipMasq was off keeps the
// bridge plugin's per-pod rule until it is recreated.
//
// The chain is per node agent (like its bridge), so two agents on one host keep separate rules, and it
// outlives the agent process, as pods do; `skiff agent -teardown` removes it.

// masqueradeChain is the agent's nat chain (iptables allows 28 bytes).
func masqueradeChain(node, dataDir string) string {
	return "SKIFF-MASQ-" + hostID(node, dataDir)
}

// masqueradeRules is the iptables-restore input that replaces the chain's rules atomically (--noflush leaves
// every other chain alone; declaring the chain empties it).
func masqueradeRules(chain string, podCIDRs []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "*nat\n:%s - [0:0]\n", chain)
	for _, cidr := range podCIDRs {
		fmt.Fprintf(&b, "-A %s -d %s -j RETURN\n", chain, cidr)
	}
	fmt.Fprintf(&b, "-A %s -d 224.0.0.0/4 -j RETURN\n", chain)
	fmt.Fprintf(&b, "-A %s -j MASQUERADE\n", chain)
	b.WriteString("COMMIT\n")
	return b.String()
}

// syncMasquerade writes the chain with podCIDRs (every Node's, this node's included) exempt, then makes sure
// POSTROUTING sends the node's pod traffic to it. With keepExisting, a chain that exists already is left as it
// is: an agent that restarted and does not know the Node list yet keeps the previous run's exemptions.
func syncMasquerade(ctx context.Context, chain, nodePodCIDR string, podCIDRs []string, keepExisting bool) error {
	exists := keepExisting && exec.CommandContext(ctx, "iptables", "-w", "5", "-t", "nat", "-S", chain).Run() == nil
	if !exists {
		restore := exec.CommandContext(ctx, "iptables-restore", "--noflush", "-w", "5")
		restore.Stdin = strings.NewReader(masqueradeRules(chain, podCIDRs))
		if out, err := restore.CombinedOutput(); err != nil {
			return fmt.Errorf("iptables-restore of %s: %v: %s", chain, err, strings.TrimSpace(string(out)))
		}
	}
	jump := func(op string) *exec.Cmd {
		return exec.CommandContext(ctx, "iptables", "-w", "5", "-t", "nat", op, "POSTROUTING",
			"-s", nodePodCIDR, "-m", "comment", "--comment", "skiff-pod-egress", "-j", chain)
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

// removeMasquerade deletes every POSTROUTING rule that jumps to the chain, then the chain. It is idempotent;
// on a host without iptables there is nothing to remove.
func removeMasquerade(ctx context.Context, chain string) error {
	out, err := exec.CommandContext(ctx, "iptables", "-w", "5", "-t", "nat", "-S", "POSTROUTING").Output()
	if errors.Is(err, exec.ErrNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listing nat POSTROUTING: %v", err)
	}
	for _, rule := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(rule, "-A POSTROUTING ") || !strings.HasSuffix(rule, " -j "+chain) {
			continue
		}
		// iptables -S prints rules as the arguments -D takes back (no quoting: the comment has no spaces).
		args := append([]string{"-w", "5", "-t", "nat", "-D"}, strings.Fields(strings.TrimPrefix(rule, "-A "))...)
		if out, err := exec.CommandContext(ctx, "iptables", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("removing %q: %v: %s", rule, err, strings.TrimSpace(string(out)))
		}
	}
	for _, op := range []string{"-F", "-X"} {
		out, err := exec.CommandContext(ctx, "iptables", "-w", "5", "-t", "nat", op, chain).CombinedOutput()
		if err != nil && !strings.Contains(string(out), "No chain") && !strings.Contains(string(out), "does not exist") {
			return fmt.Errorf("iptables %s %s: %v: %s", op, chain, err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}
