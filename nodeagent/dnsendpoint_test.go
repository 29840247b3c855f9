package nodeagent

import (
	"strings"
	"testing"

	"github.com/skiff-dev/skiff/config"
)

// A Corefile override with a mistake stops the agent at start, naming the agent file's line of the mistake.
func TestValidateDNSPointsAtTheAgentFile(t *testing.T) {
	cfg := &config.Agent{Runtime: config.RuntimeContainerd, DNS: config.AgentDNS{Enabled: true,
		Corefile:     ".:53 {\n    bind {{.Bind}}\n    rewrite name a b\n}\n",
		CorefileFile: "/etc/skiff/agent.hcl", CorefileLine: 12}}
	err := validateDNS(cfg)
	want := "/etc/skiff/agent.hcl:14: agent.dns.corefile: Corefile line 3: Unknown directive 'rewrite'"
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("error %v, want %q", err, want)
	}
	cfg.DNS.Corefile = ".:53 {\n    bind {{.Bind}}\n    errors\n}\n"
	if err := validateDNS(cfg); err != nil {
		t.Fatalf("a good Corefile: %v", err)
	}
	cfg.DNS.Corefile, cfg.Runtime = "not a corefile {{", config.RuntimeSimulated
	if err := validateDNS(cfg); err != nil {
		t.Fatalf("the simulated runtime runs no DNS, yet: %v", err)
	}
}

func TestGatewayAddr(t *testing.T) {
	gw, ipn, err := gatewayAddr("10.244.3.0/24")
	if err != nil || gw.String() != "10.244.3.1" || ipn.String() != "10.244.3.0/24" {
		t.Fatalf("gateway %v %v %v", gw, ipn, err)
	}
	if _, _, err := gatewayAddr("fd00::/64"); err == nil {
		t.Fatal("accepted an IPv6 pod CIDR")
	}
}

// The node's DNS is ready at its first answer and stays so until probeFailureThreshold probes in a row fail.
func TestDNSReadinessNeedsFailuresInARow(t *testing.T) {
	var r readiness
	steps := []struct {
		answered, want bool
	}{{false, false}, {true, true}, {false, true}, {false, true}, {true, true}, {false, true}, {false, true}, {false, false}, {false, false}, {true, true}}
	for i, s := range steps {
		if got := r.observe(s.answered); got != s.want {
			t.Fatalf("probe %d (answered %v): ready %v, want %v", i, s.answered, got, s.want)
		}
	}
}
