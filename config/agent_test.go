package config

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

const agentExample = `
name      = "node-1"
data_dir  = "/var/lib/skiff/node-1"
bind_addr = "127.0.0.1"
agent {
  servers     = ["127.0.0.1:6443", "127.0.0.2"]
  token       = "abcdefabcdefabcdef"
  node_labels = { "disktype" = "ssd" }
  node_taints = ["dedicated=infra:NoSchedule", "gpu:PreferNoSchedule"]
  max_pods    = 50
  runtime     = "simulated"
  registry "registry.example.com:5000" {
    endpoints  = ["https://mirror.internal:5000"]
    plain_http = true
  }
  proxy {
    min_sync_interval = "250ms"
  }
  network_policy {
    enabled = false
  }
  simulated {
    nodes  = 5000
    cpu    = "4"
    memory = "8Gi"
    labels = { "topology.kubernetes.io/zone" = "zone-%d" }
    zones  = 3
    kubeconfig = "/var/lib/skiff/admin.kubeconfig"
  }
}
`

func TestLoadAgentExample(t *testing.T) {
	a, err := LoadAgent(writeFile(t, agentExample), nil)
	if err != nil {
		t.Fatal(err)
	}
	if a.Name != "node-1" || a.AdvertiseAddr != "127.0.0.1" || a.MaxPods != 50 || a.Runtime != RuntimeSimulated {
		t.Fatalf("resolved %+v", a)
	}
	if strings.Join(a.Servers, ",") != "127.0.0.1:6443,127.0.0.2:6443" {
		t.Errorf("servers %v", a.Servers)
	}
	want := []corev1.Taint{{Key: "dedicated", Value: "infra", Effect: corev1.TaintEffectNoSchedule}, {Key: "gpu", Effect: corev1.TaintEffectPreferNoSchedule}}
	if len(a.NodeTaints) != 2 || a.NodeTaints[0] != want[0] || a.NodeTaints[1] != want[1] {
		t.Errorf("taints %v", a.NodeTaints)
	}
	if a.NodeLabels["disktype"] != "ssd" || len(a.Registries) != 1 || !a.Registries[0].PlainHTTP || a.Registries[0].Host != "registry.example.com:5000" {
		t.Errorf("labels %v registries %+v", a.NodeLabels, a.Registries)
	}
	if s := a.Simulated; s.Nodes != 5000 || s.Zones != 3 || s.CPU.String() != "4" || s.Memory.String() != "8Gi" || s.Labels["topology.kubernetes.io/zone"] != "zone-%d" {
		t.Errorf("simulated %+v", s)
	}
	if p := a.Proxy; !p.Enabled || p.MinSyncInterval != 250*time.Millisecond || p.FullSyncInterval != 30*time.Second {
		t.Errorf("proxy %+v (defaults kept beside the file's min_sync_interval)", p)
	}
	if a.NetworkPolicy {
		t.Error("network_policy { enabled = false } left policies enforced")
	}
	if d, err := LoadAgent(writeFile(t, "name = \"n1\"\ndata_dir = \"/tmp/x\"\nagent {\n  servers = [\"127.0.0.1\"]\n  token = \"0123456789abcdef\"\n}\n"), nil); err != nil || !d.NetworkPolicy {
		t.Errorf("by default policies are enforced: %v %v", d, err)
	}
}

func TestAgentErrorsNameFileLineAndKey(t *testing.T) {
	base := "name = \"n1\"\ndata_dir = \"/tmp/x\"\nagent {\n  servers = [\"127.0.0.1\"]\n  token = \"0123456789abcdef\"\n"
	cases := []struct{ name, body, want string }{
		{"unknown key", base + "  colour = 1\n}\n", ":6: agent.colour: Unsupported argument"},
		{"bad taint effect", base + "  node_taints = [\"a=b:Sometimes\"]\n}\n", ":6: agent.node_taints: taint \"a=b:Sometimes\": effect"},
		{"taint without effect", base + "  node_taints = [\"a=b\"]\n}\n", ":6: agent.node_taints: taint \"a=b\" lacks an effect"},
		{"bad label", base + "  node_labels = { \"bad key!\" = \"v\" }\n}\n", ":6: agent.node_labels: label key \"bad key!\""},
		{"bad runtime", base + "  runtime = \"docker\"\n}\n", ":6: agent.runtime: \"docker\" is not one of containerd, simulated"},
		{"bad quantity", base + "  simulated {\n    cpu = \"lots\"\n  }\n}\n", ":7: agent.simulated.cpu: \"lots\" is not a quantity"},
		{"many simulated nodes, one identity", base + "  runtime = \"simulated\"\n  simulated {\n    nodes = 2\n  }\n}\n", "agent.simulated.kubeconfig: required to simulate more than one node"},
		{"bad pod_cidr", base + "  pod_cidr = \"10.0.0.0\"\n}\n", ":6: agent.pod_cidr: \"10.0.0.0\" is not an IPv4 CIDR"},
		{"ipv6 pod_cidr", base + "  pod_cidr = \"fd00::/64\"\n}\n", ":6: agent.pod_cidr: \"fd00::/64\" is not an IPv4 CIDR"},
		{"no token", "name = \"n1\"\ndata_dir = \"/tmp/x\"\nagent {\n  servers = [\"127.0.0.1\"]\n}\n", "agent.token: is required"},
		{"no servers", "name = \"n1\"\ndata_dir = \"/tmp/x\"\nagent {\n  token = \"t\"\n}\n", "agent.servers: lists no server"},
		{"bad encrypt key", "encrypt = \"not-base64!\"\n" + base + "}\n", ":1: encrypt: must be a base64 key of 16, 24 or 32 bytes"},
		{"short encrypt key", "encrypt = \"c2hvcnQ=\"\n" + base + "}\n", ":1: encrypt: must be a base64 key"},
		{"negative retry_max", base + "  retry_max = -1\n}\n", ":6: agent.retry_max: must be 0 (forever) or more"},
		{"bad retry_join", base + "  retry_join = [\"host:notaport\"]\n}\n", ":6: agent.retry_join: entry 0"},
		{"bad proxy interval", base + "  proxy {\n    min_sync_interval = \"soon\"\n  }\n}\n", ":7: agent.proxy.min_sync_interval: \"soon\" is not a duration"},
		{"zero proxy interval", base + "  proxy {\n    full_sync_interval = \"0s\"\n  }\n}\n", ":7: agent.proxy.full_sync_interval: \"0s\" must be positive"},
		{"full sync shorter than min", base + "  proxy {\n    min_sync_interval = \"10s\"\n    full_sync_interval = \"5s\"\n  }\n}\n", ":8: agent.proxy.full_sync_interval: 5s is shorter than min_sync_interval"},
		{"bad name", "name = \"Node_1\"\ndata_dir = \"/tmp/x\"\nagent {\n  servers = [\"127.0.0.1\"]\n  token = \"t\"\n}\n", ":1: name: \"Node_1\" is not a valid node name"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, tc.body)
			_, err := LoadAgent(path, nil)
			if err == nil {
				t.Fatal("accepted")
			}
			want := tc.want
			if strings.HasPrefix(want, ":") {
				want = path + want
			}
			if !strings.Contains(err.Error(), want) {
				t.Fatalf("error %q does not contain %q", err, want)
			}
		})
	}
}

// An agent that joins by gossip needs no servers: it learns them from the pool.
func TestAgentGossipJoin(t *testing.T) {
	a, err := LoadAgent(writeFile(t, `
name     = "node-1"
data_dir = "/var/lib/skiff/node-1"
encrypt  = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="
ports { gossip = 7950 }
agent {
  retry_join     = ["10.0.0.1", "10.0.0.2:7000"]
  retry_interval = "3s"
  retry_max      = 5
  token          = "abcdefabcdefabcdef"
}
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(a.RetryJoin, ",") != "10.0.0.1:7950,10.0.0.2:7000" || a.RetryInterval.String() != "3s" || a.RetryMax != 5 ||
		a.GossipPort != 7950 || a.Encrypt == "" || len(a.Servers) != 0 {
		t.Fatalf("resolved %+v", a)
	}
}

func TestAgentDNS(t *testing.T) {
	base := "name = \"n1\"\ndata_dir = \"/tmp/x\"\nagent {\n  servers = [\"127.0.0.1\"]\n  token = \"0123456789abcdef\"\n"
	a, err := LoadAgent(writeFile(t, base+"}\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !a.DNS.Enabled || a.DNS.Corefile != "" {
		t.Errorf("default dns %+v, want enabled with the built-in Corefile", a.DNS)
	}
	cases := []struct {
		name, body string
		line       int // of the Corefile's first line
	}{
		{"heredoc", base + "  dns {\n    corefile = <<EOF\n.:53 {\n    errors\n}\nEOF\n  }\n}\n", 8},
		{"indented heredoc", base + "  dns {\n    enabled = true\n    corefile = <<-EOF\n      .:53 {\n        errors\n      }\n    EOF\n  }\n}\n", 9},
		{"quoted", base + "  dns {\n    corefile = \".:53 {\\n errors\\n}\\n\"\n  }\n}\n", 7},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, tc.body)
			a, err := LoadAgent(path, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(strings.TrimSpace(a.DNS.Corefile), ".:53 {") || a.DNS.CorefileFile != path || a.DNS.CorefileLine != tc.line {
				t.Errorf("dns %+v, want the Corefile from %s:%d", a.DNS, path, tc.line)
			}
		})
	}
	a, err = LoadAgent(writeFile(t, base+"  dns {\n    enabled = false\n  }\n}\n"), nil)
	if err != nil || a.DNS.Enabled {
		t.Errorf("enabled = false: %+v, %v", a.DNS, err)
	}
	path := writeFile(t, base+"  dns {\n    corefile = \"  \"\n  }\n}\n")
	if _, err := LoadAgent(path, nil); err == nil || !strings.Contains(err.Error(), path+":7: agent.dns.corefile: is empty") {
		t.Errorf("empty corefile: %v", err)
	}
}
