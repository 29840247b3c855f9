package proxy

import (
	"crypto/sha256"
	"encoding/base32"
	"strings"
)

// Chain names. iptables allows 28 bytes; every name starts with "SKIFF-<id>-" (17 bytes with the 8-digit
// host id), so the owner of any chain can be read off its name.
const (
	chainPrefix = "SKIFF-"
	maxChainLen = 28

	// masqueradeMark is the packet-mark bit that asks the postrouting chain to masquerade, kube-proxy's
	// default bit 14. Agents sharing a namespace share it harmlessly: a marked packet is masqueraded once.
	masqueradeMark = "0x4000"
)

// chainNames are the fixed chains of one agent.
type chainNames struct {
	services    string // nat: jumped from PREROUTING and OUTPUT, one rule per ClusterIP port
	nodePorts   string // nat: the services chain's last rule, for traffic addressed to this host
	markMasq    string // nat: sets the masquerade bit
	postrouting string // nat: masquerades packets that carry the bit
	filter      string // filter: REJECT/DROP for Services without usable endpoints
	servicePfx  string // nat: SKIFF-<id>-S-<hash>, one per service port (cluster-wide endpoints)
	endpointPfx string // nat: SKIFF-<id>-E-<hash>, one per endpoint of a service port
	externalPfx string // nat: SKIFF-<id>-X-<hash>, NodePorts with externalTrafficPolicy: Local
	localPfx    string // nat: SKIFF-<id>-L-<hash>, internalTrafficPolicy: Local
	ownerPrefix string // every chain of this agent starts with it
}

func namesFor(id string) chainNames {
	p := chainPrefix + id + "-"
	return chainNames{
		services: p + "SVCS", nodePorts: p + "NODEPORTS", markMasq: p + "MARK-MASQ", postrouting: p + "POSTRTG",
		filter: p + "FILTER", servicePfx: p + "S-", endpointPfx: p + "E-", externalPfx: p + "X-", localPfx: p + "L-",
		ownerPrefix: p,
	}
}

// hashedChain is prefix plus a base32 hash of the parts, cut to fill the 28 bytes (11 characters, 55 bits,
// with an 8-digit id): stable across restarts, so a restart rewrites the same chains.
func (n chainNames) hashedChain(prefix string, parts ...string) string {
	sum := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	enc := base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:])
	return prefix + enc[:maxChainLen-len(prefix)]
}

// MasqueradeChain is the nat chain of an agent's pod egress masquerade (masquerade.go).
func MasqueradeChain(id string) string { return chainPrefix + "MASQ-" + id }

// chainOwnerID returns the host id a Skiff chain name carries, or "" for any other chain.
func chainOwnerID(chain string) string {
	rest, ok := strings.CutPrefix(chain, chainPrefix)
	if !ok {
		return ""
	}
	rest = strings.TrimPrefix(rest, "MASQ-")
	rest = strings.TrimPrefix(rest, "NP-") // network policy chains (nodeagent/netpol)
	if len(rest) < 8 || (len(rest) > 8 && rest[8] != '-') {
		return ""
	}
	for _, c := range rest[:8] {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z') {
			return ""
		}
	}
	return rest[:8]
}
