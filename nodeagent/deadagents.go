package nodeagent

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/hashicorp/go-hclog"

	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/nodeagent/netpol"
	"github.com/skiff-dev/skiff/nodeagent/proxy"
)

// What dead agents leave on a shared host. An agent killed outright (kill -9, an OOM kill) leaves its pods
// running, pinned in their network namespaces on its bridge, which holds the pod CIDR's gateway address and
// with it the host's route to the pod CIDR; its private containerd and the containers' shims run on; its
// iptables chains keep acting on traffic. Nothing else would ever remove them, and the next agent on the host
// with the same pod CIDR (every `skiff dev` has 10.244.0.0/24) has its pods' traffic routed into the dead
// bridge. So an agent that starts removes what agents that are not alive left, by the proof of life its
// iptables chains already use (proxy/ownership.go: a flock on the owner's data dir, which the kernel drops
// when the process dies): their chains, their pods with everything Teardown removes when the owner ran a
// private containerd under its data dir, and their bridges. An agent's own leftovers, and a live agent's,
// are never touched: a restarted agent adopts its pods.

// removeDeadAgents removes the leftovers of every agent on this host that is not alive. self is this agent's
// hostID; the caller holds its Claim. A failure is logged: the agent runs on.
func removeDeadAgents(ctx context.Context, cfg *config.Agent, self string, logger hclog.Logger) {
	dead, err := proxy.RemoveStale(ctx, proxy.Commands{}, self) // network policy chains too
	if err != nil {
		logger.Warn("removing iptables rules of dead agents", "error", err)
	}
	if len(dead) > 0 { // their chains are gone: no rule names their sets any more
		if err := netpol.RemoveSets(ctx, netpol.Commands{}, func(id string) bool { _, ok := dead[id]; return ok }); err != nil {
			logger.Warn("removing ipsets of dead agents", "error", err)
		}
	}
	if dead == nil {
		dead = map[string]string{}
	}
	bridges, err := ownedBridges(ctx)
	if err != nil {
		logger.Warn("listing the host's bridges", "error", err)
	}
	for id, dir := range bridges {
		if id != self && !proxy.OwnerAlive(dir) {
			dead[id] = dir
		}
	}
	ids := make([]string, 0, len(dead))
	for id := range dead {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		dir := dead[id]
		if err := removeDeadAgent(ctx, cfg, id, dir, logger); err != nil {
			logger.Warn("removing what a dead agent left", "agent", id, "data_dir", dir, "error", err)
		} else {
			logger.Info("removed what a dead agent left", "agent", id, "data_dir", dir)
		}
	}
}

// removeDeadAgent removes one dead agent's pods (when it ran a private containerd under dir, as this agent
// does; a shared containerd's "skiff" namespace may hold other agents' pods) and its bridge.
func removeDeadAgent(ctx context.Context, cfg *config.Agent, id, dir string, logger hclog.Logger) error {
	if dir != "" && cfg.ContainerdSocket == "" {
		if _, err := os.Stat(filepath.Join(dir, "containerd")); err == nil {
			// Its lock, for the length of the teardown: an agent that comes back on dir meanwhile waits.
			lock, err := proxy.Claim(dir, 0)
			if err != nil {
				return nil // alive again
			}
			defer lock.Release()
			dead := *cfg
			dead.DataDir = dir
			if err := teardown(ctx, &dead, id, logger.Named("dead-agent")); err != nil {
				return err
			}
		}
	}
	return removeBridge(ctx, bridgeOf(id))
}

// ownedBridges lists the host's bridges named as agents name theirs, with the data dir their owner comment
// names ("" when the alias names none: such a bridge counts as alive).
func ownedBridges(ctx context.Context) (map[string]string, error) {
	out, err := exec.CommandContext(ctx, "ip", "-j", "link", "show", "type", "bridge").Output()
	if err != nil {
		return nil, fmt.Errorf("ip link show type bridge: %w", err)
	}
	var links []struct {
		Name  string `json:"ifname"`
		Alias string `json:"ifalias"`
	}
	if err := json.Unmarshal(out, &links); err != nil {
		return nil, fmt.Errorf("ip link show type bridge: %w", err)
	}
	owned := map[string]string{}
	for _, l := range links {
		id, ok := strings.CutPrefix(l.Name, bridgePrefix)
		if !ok || len(id) != 8 {
			continue
		}
		owner, dir, ok := proxy.ParseOwnerComment(l.Alias)
		if !ok || owner != id {
			dir = ""
		}
		owned[id] = dir
	}
	return owned, nil
}

// removeBridge deletes a bridge, and with it its addresses and routes; a missing one is no error.
func removeBridge(ctx context.Context, bridge string) error {
	out, err := exec.CommandContext(ctx, "ip", "link", "del", bridge).CombinedOutput()
	if err != nil && !strings.Contains(string(out), "Cannot find device") {
		return fmt.Errorf("removing bridge %s: %v: %s", bridge, err, strings.TrimSpace(string(out)))
	}
	return nil
}
