package proxy

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
)

// bridgeNetfilterSysctl makes traffic between ports of a Linux bridge pass through iptables.
const bridgeNetfilterSysctl = "/proc/sys/net/bridge/bridge-nf-call-iptables"

// enableBridgeNetfilter sets bridge-nf-call-iptables in this network namespace, loading br_netfilter when the
// sysctl does not exist yet. Without it, a pod that reaches a ClusterIP whose endpoint sits on the same node's
// bridge gets the reply straight from the endpoint over the bridge, untranslated, and drops it; kube-proxy
// needs the same setting.
func enableBridgeNetfilter() error {
	if _, err := os.Stat(bridgeNetfilterSysctl); errors.Is(err, os.ErrNotExist) {
		if out, err := exec.Command("modprobe", "br_netfilter").CombinedOutput(); err != nil {
			return fmt.Errorf("loading br_netfilter: %v: %s", err, strings.TrimSpace(string(out)))
		}
	}
	if cur, err := os.ReadFile(bridgeNetfilterSysctl); err == nil && strings.TrimSpace(string(cur)) == "1" {
		return nil
	}
	return os.WriteFile(bridgeNetfilterSysctl, []byte("1"), 0o644)
}
