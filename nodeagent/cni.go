package nodeagent

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	corev1 "k8s.io/api/core/v1"
)

// cniBinDirs are where Debian's containernetworking-plugins and upstream installs put the plugins.
var cniBinDirs = []string{"/usr/lib/cni", "/opt/cni/bin"}

// podNetwork wires pods to the node's bridge with the standard CNI plugins: bridge with host-local IPAM on
// the node's pod CIDR, then portmap for hostPorts; loopback brings up lo. Allocations and the CNI cache live
// under the agent's data dir, so an agent restart finds them again and never leaks an IP.
type podNetwork struct {
	cni      *libcni.CNIConfig
	list     *libcni.NetworkConfigList
	loopback *libcni.NetworkConfigList
	bridge   string
}

// bridgeName is a per-node Linux bridge name (at most 15 bytes), stable across restarts and distinct for two
// agents on one host.
func bridgeName(node, dataDir string) string { return bridgeOf(hostID(node, dataDir)) }

// bridgeOf is the bridge of the agent with this hostID.
func bridgeOf(id string) string { return bridgePrefix + id }

const bridgePrefix = "skiff"

// claimBridge makes sure the node's pod bridge exists and names its owner in the link's alias: the owner
// comment of the agent's iptables chains (proxy.OwnerComment), so that another agent that finds the owner
// dead removes the bridge (removeDeadAgents). The CNI bridge plugin takes over a bridge that exists.
func claimBridge(ctx context.Context, bridge, owner string) error {
	if exec.CommandContext(ctx, "ip", "link", "show", "dev", bridge).Run() != nil {
		out, err := exec.CommandContext(ctx, "ip", "link", "add", bridge, "type", "bridge").CombinedOutput()
		if err != nil && !strings.Contains(string(out), "File exists") {
			return fmt.Errorf("creating bridge %s: %v: %s", bridge, err, strings.TrimSpace(string(out)))
		}
	}
	if out, err := exec.CommandContext(ctx, "ip", "link", "set", "dev", bridge, "alias", owner).CombinedOutput(); err != nil {
		return fmt.Errorf("naming the owner of bridge %s: %v: %s", bridge, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// hostID names what one agent makes on its host (bridge, nat chain): 8 hex digits, stable across restarts.
func hostID(node, dataDir string) string {
	h := fnv.New32a()
	h.Write([]byte(node + "\x00" + dataDir))
	return fmt.Sprintf("%08x", h.Sum32())
}

// newPodNetwork is the pod network of the agent with this hostID and data dir.
func newPodNetwork(id, dataDir, podCIDR string) (*podNetwork, error) {
	if _, _, err := net.ParseCIDR(podCIDR); err != nil {
		return nil, fmt.Errorf("no usable pod CIDR (%q); set agent.pod_cidr or the servers' cluster_cidr", podCIDR)
	}
	bridge := bridgeOf(id)
	ipamDir := filepath.Join(dataDir, "cni", "ipam")
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "skiff",
		"plugins": []any{
			map[string]any{
				"type": "bridge", "bridge": bridge, "isGateway": true, "hairpinMode": true,
				// No ipMasq: it would SNAT pod-to-pod traffic across nodes (see proxy/masquerade.go).
				"ipam": map[string]any{
					"type": "host-local", "dataDir": ipamDir,
					"ranges": [][]map[string]string{{{"subnet": podCIDR}}},
					"routes": []map[string]string{{"dst": "0.0.0.0/0"}},
				},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}, "snat": true},
		},
	}
	raw, err := json.Marshal(conf)
	if err != nil {
		return nil, err
	}
	list, err := libcni.ConfListFromBytes(raw)
	if err != nil {
		return nil, err
	}
	loopback, err := libcni.ConfListFromBytes([]byte(`{"cniVersion":"1.0.0","name":"skiff-lo","plugins":[{"type":"loopback"}]}`))
	if err != nil {
		return nil, err
	}
	cacheDir := filepath.Join(dataDir, "cni", "cache")
	if err := os.MkdirAll(cacheDir, 0o700); err != nil {
		return nil, err
	}
	return &podNetwork{cni: libcni.NewCNIConfigWithCacheDir(cniBinDirs, cacheDir, nil), list: list, loopback: loopback, bridge: bridge}, nil
}

func (n *podNetwork) runtimeConf(sandboxID, netns string, pod *corev1.Pod) *libcni.RuntimeConf {
	var ports []map[string]any
	for _, c := range pod.Spec.Containers {
		for _, p := range c.Ports {
			if p.HostPort == 0 {
				continue
			}
			proto := p.Protocol
			if proto == "" {
				proto = corev1.ProtocolTCP
			}
			ports = append(ports, map[string]any{"hostPort": p.HostPort, "containerPort": p.ContainerPort,
				"protocol": map[corev1.Protocol]string{corev1.ProtocolTCP: "tcp", corev1.ProtocolUDP: "udp", corev1.ProtocolSCTP: "sctp"}[proto],
				"hostIP":   p.HostIP})
		}
	}
	rt := &libcni.RuntimeConf{ContainerID: sandboxID, NetNS: netns, IfName: "eth0",
		Args: [][2]string{{"K8S_POD_NAMESPACE", pod.Namespace}, {"K8S_POD_NAME", pod.Name}, {"K8S_POD_UID", string(pod.UID)}, {"IgnoreUnknown", "1"}}}
	if len(ports) > 0 {
		rt.CapabilityArgs = map[string]any{"portMappings": ports}
	}
	return rt
}

// add attaches the sandbox's network namespace and returns the pod IP.
func (n *podNetwork) add(ctx context.Context, sandboxID, netns string, pod *corev1.Pod) (string, error) {
	if _, err := n.cni.AddNetworkList(ctx, n.loopback, &libcni.RuntimeConf{ContainerID: sandboxID, NetNS: netns, IfName: "lo"}); err != nil {
		return "", fmt.Errorf("CNI loopback: %w", err)
	}
	res, err := n.cni.AddNetworkList(ctx, n.list, n.runtimeConf(sandboxID, netns, pod))
	if err != nil {
		return "", fmt.Errorf("CNI add: %w", err)
	}
	result, err := current.NewResultFromResult(res)
	if err != nil {
		return "", err
	}
	for _, ip := range result.IPs {
		if ip.Address.IP.To4() != nil {
			return ip.Address.IP.String(), nil
		}
	}
	return "", fmt.Errorf("CNI returned no IPv4 address")
}

// del detaches the sandbox and releases its IP. It works from the CNI cache, so it also succeeds after the
// network namespace is gone, and it is idempotent. The configuration the pod was added with is the one
// deleted with: a pod wired before an upgrade changed it (the bridge's ipMasq, say) has its own rules removed.
func (n *podNetwork) del(ctx context.Context, sandboxID, netns string, pod *corev1.Pod) error {
	rt := n.runtimeConf(sandboxID, netns, pod)
	list := n.list
	if cached, cachedRT, err := n.cni.GetNetworkListCachedConfig(n.list, rt); err == nil && cached != nil && cachedRT != nil {
		rt.CapabilityArgs = cachedRT.CapabilityArgs
		if added, err := libcni.ConfListFromBytes(cached); err == nil {
			list = added
		}
	}
	if err := n.cni.DelNetworkList(ctx, list, rt); err != nil {
		return fmt.Errorf("CNI del: %w", err)
	}
	_ = n.cni.DelNetworkList(ctx, n.loopback, &libcni.RuntimeConf{ContainerID: sandboxID, NetNS: netns, IfName: "lo"})
	return nil
}
