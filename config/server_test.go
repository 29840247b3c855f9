package config

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "server.hcl")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const example = `name      = "cp-1"
data_dir  = "/var/lib/skiff/cp-1"
bind_addr = "127.0.0.1"
log_level = "info"
ports {
  api    = 6443
  raft   = 6444
  gossip = 7946
}
server {
  enabled          = true
  bootstrap_expect = 3
  retry_join       = ["127.0.0.2:7946", "127.0.0.3"]
  token            = "0123456789abcdef0123"
  raft {
    heartbeat_timeout  = "1s"
    election_timeout   = "1s"
    snapshot_threshold = 8192
  }
}
`

func TestLoadServerExample(t *testing.T) {
	s, err := LoadServer(writeFile(t, example), nil)
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "cp-1" || s.BootstrapExpect != 3 || s.HeartbeatTimeout != time.Second || s.AdvertiseAddr != "127.0.0.1" {
		t.Fatalf("loaded %+v", s)
	}
	if strings.Join(s.RetryJoin, ",") != "127.0.0.2:7946,127.0.0.3:7946" {
		t.Fatalf("retry_join = %v", s.RetryJoin)
	}
	if s.MemoryLimit != 0 {
		t.Fatalf("memory_limit not set, but %d", s.MemoryLimit)
	}
	if s, err := LoadServer(writeFile(t, "memory_limit = \"1536Mi\"\n"), nil); err != nil {
		t.Fatal(err)
	} else if s.MemoryLimit != 1536<<20 {
		t.Fatalf("memory_limit 1536Mi: %d bytes", s.MemoryLimit)
	}
	// Defaults fill what the file leaves out.
	if s.LeaderLeaseTimeout != 250*time.Millisecond || s.HistoryAge != 5*time.Minute || s.WriteTimeout != 10*time.Second {
		t.Fatalf("defaults not applied: %+v", s)
	}
}

func TestFlagsOverrideFile(t *testing.T) {
	flags := &ServerFile{Name: ptr("from-flag"), Server: &ServerBlock{BootstrapExpect: ptr(5)}}
	s, err := LoadServer(writeFile(t, example), flags)
	if err != nil {
		t.Fatal(err)
	}
	if s.Name != "from-flag" || s.BootstrapExpect != 5 || s.DataDir != "/var/lib/skiff/cp-1" {
		t.Fatalf("merged %+v", s)
	}
}

// Load balancer pools: the default one first, then the named ones by name.
func TestLoadBalancerPools(t *testing.T) {
	cfg, err := LoadServer(writeFile(t, "server {\n  load_balancer {\n    pool = [\"10.10.0.0/30\", \"10.10.1.9\"]\n    pools = { z = [\"192.0.2.1-192.0.2.2\"], edge = [\"198.51.100.0/31\"] }\n  }\n}\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range cfg.LoadBalancerPools {
		got = append(got, fmt.Sprintf("%s=%v", p.Name, p.Ranges))
	}
	if want := "[default=[10.10.0.1-10.10.0.2 10.10.1.9] edge=[198.51.100.0-198.51.100.1] z=[192.0.2.1-192.0.2.2]]"; fmt.Sprint(got) != want {
		t.Fatalf("pools %v, want %s", got, want)
	}
	if cfg, err := LoadServer("", nil); err != nil || cfg.LoadBalancerPools != nil {
		t.Fatalf("no load_balancer block: pools %v, %v", cfg.LoadBalancerPools, err)
	}
}

func TestServerErrorsNameFileLineAndKey(t *testing.T) {
	cases := []struct {
		name string
		body string
		want string // substring: file:line: key: message
	}{
		{"unknown top-level key", "name = \"a\"\nbogus = 1\n", ":2: bogus: Unsupported argument"},
		{"unknown nested key", "server {\n  raft {\n    electon_timeout = \"1s\"\n  }\n}\n", ":3: server.raft.electon_timeout: Unsupported argument"},
		{"unknown block", "servr {\n}\n", ":1: servr: Unsupported block type"},
		{"pod security level", "server {\n  pod_security {\n    enforce = \"strict\"\n  }\n}\n", ":3: server.pod_security.enforce: must be one of privileged, baseline, restricted"},
		{"audit without a policy", "server {\n  audit {\n    path = \"/tmp/audit.log\"\n  }\n}\n", ":2: server.audit.policy_file: is required with server.audit.path"},
		{"audit policy missing", "server {\n  audit {\n    path = \"/tmp/audit.log\"\n    policy_file = \"/nonexistent/policy.yaml\"\n  }\n}\n", ":4: server.audit.policy_file: stat /nonexistent/policy.yaml"},
		{"negative audit size", "server {\n  audit {\n    max_size = -1\n  }\n}\n", ":3: server.audit.max_size: must be 0 or more"},
		{"wrong type", "ports {\n  api = \"high\"\n}\n", ":2: ports.api: Unsuitable value type"},
		{"bad duration", "server {\n  raft {\n    election_timeout = \"1x\"\n  }\n}\n", ":3: server.raft.election_timeout: \"1x\" is not a duration"},
		{"negative duration", "server {\n  retry_interval = \"-1s\"\n}\n", ":2: server.retry_interval: \"-1s\" must be positive"},
		{"bootstrap_expect below 1", "server {\n  bootstrap_expect = 0\n}\n", ":2: server.bootstrap_expect: must be at least 1"},
		{"duplicate ports", "ports {\n  api = 7000\n  raft = 7000\n}\n", ":3: ports.raft: port 7000 is already used by ports.api"},
		{"bad bind_addr", "bind_addr = \"localhost\"\n", ":1: bind_addr: \"localhost\" is not an IP address"},
		{"bad log level", "log_level = \"loud\"\n", ":1: log_level:"},
		{"syntax error", "name = \n", ":1"},
		{"bad service_cidr", "server {\n  service_cidr = \"10.96.0.0\"\n}\n", ":2: server.service_cidr: \"10.96.0.0\" is not an IPv4 CIDR"},
		{"cluster_dns outside service_cidr", "server {\n  cluster_dns = \"10.0.0.10\"\n}\n", ":2: server.cluster_dns: 10.0.0.10 is not in service_cidr 10.96.0.0/16"},
		{"cluster_dns is the kubernetes Service's", "server {\n  cluster_dns = \"10.96.0.1\"\n}\n", ":2: server.cluster_dns: 10.96.0.1 is the network address or the kubernetes Service's"},
		{"cluster_dns not an address", "server {\n  cluster_dns = \"dns\"\n}\n", ":2: server.cluster_dns: \"dns\" is not an IPv4 address"},
		{"bad cluster_domain", "server {\n  cluster_domain = \"Cluster_Local\"\n}\n", ":2: server.cluster_domain: \"Cluster_Local\" is not a DNS name"},
		{"short token", "server {\n  token = \"short\"\n}\n", ":2: server.token: the secret must be at least 16 characters"},
		{"token with a bad CA hash", "server {\n  token = \"K10abc::0123456789abcdef\"\n}\n", ":2: server.token: the CA hash after \"K10\" must be 64 hex digits"},
		{"no token for three servers", "server {\n  bootstrap_expect = 3\n}\n", ":1: server.token: is required with bootstrap_expect = 3"},
		{"bad retry_join", "server {\n  retry_join = [\"a:b:c\"]\n}\n", ":2: server.retry_join: entry 0"},
		{"empty manifests_dir", "server {\n  manifests_dir = \"\"\n}\n", ":2: server.manifests_dir: must not be empty"},
		{"bad encrypt key", "encrypt = \"c2hvcnQ=\"\n", ":1: encrypt: must be a base64 key of 16, 24 or 32 bytes"},
		{"memory_limit not a quantity", "memory_limit = \"2GB of RAM\"\n", ":1: memory_limit: \"2GB of RAM\" is not a quantity of bytes"},
		{"memory_limit too small", "memory_limit = \"64Mi\"\n", ":1: memory_limit: \"64Mi\" is below the least a server runs in, 256Mi"},
		{"load balancer pool not an address", "server {\n  load_balancer {\n    pool = [\"10.10.0.0/28\", \"lb\"]\n  }\n}\n", ":3: server.load_balancer.pool: entry 1: \"lb\" is not an IPv4 address"},
		{"load balancer pool in the service CIDR", "server {\n  load_balancer {\n    pool = [\"10.96.0.0/28\"]\n  }\n}\n", ":3: server.load_balancer.pool: entry 0: 10.96.0.1-10.96.0.14 overlaps server.service_cidr 10.96.0.0/16"},
		{"load balancer pools overlapping", "server {\n  load_balancer {\n    pool = [\"10.10.0.0/28\"]\n    pools = { edge = [\"10.10.0.5-10.10.0.20\"] }\n  }\n}\n", ":4: server.load_balancer.pools: pool \"edge\", entry 0: 10.10.0.5-10.10.0.20 overlaps entry 0 of server.load_balancer.pool"},
		{"load balancer pool in the cluster CIDR", "server {\n  load_balancer {\n    pools = { edge = [\"10.244.7.7\"] }\n  }\n}\n", ":3: server.load_balancer.pools: pool \"edge\", entry 0: 10.244.7.7 overlaps server.cluster_cidr 10.244.0.0/16"},
		{"load balancer pool named badly", "server {\n  load_balancer {\n    pools = { Edge_1 = [\"10.10.0.7\"] }\n  }\n}\n", ":3: server.load_balancer.pools: \"Edge_1\" is not a valid pool name"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, tc.body)
			_, err := LoadServer(path, nil)
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), path+tc.want) {
				t.Fatalf("error %q does not contain %q", err, path+tc.want)
			}
		})
	}
}

func TestAllErrorsReportedAtOnce(t *testing.T) {
	_, err := LoadServer(writeFile(t, "log_level = \"x\"\nserver {\n  bootstrap_expect = -1\n}\n"), nil)
	es, ok := err.(Errors)
	if !ok || len(es) != 2 {
		t.Fatalf("errors = %v", err)
	}
}

func TestClusterDNSDefaultsToTheTenthServiceAddress(t *testing.T) {
	for _, tc := range []struct{ body, dns, domain string }{
		{"", "10.96.0.10", "cluster.local"},
		{"server {\n  service_cidr = \"10.100.0.0/24\"\n}\n", "10.100.0.10", "cluster.local"},
		{"server {\n  cluster_dns = \"10.96.5.5\"\n  cluster_domain = \"corp.example.\"\n}\n", "10.96.5.5", "corp.example"},
	} {
		s, err := LoadServer(writeFile(t, tc.body), nil)
		if err != nil {
			t.Fatal(err)
		}
		if s.ClusterDNS != tc.dns || s.ClusterDomain != tc.domain {
			t.Errorf("%q: cluster DNS %s %s, want %s %s", tc.body, s.ClusterDNS, s.ClusterDomain, tc.dns, tc.domain)
		}
	}
}

func TestManifestsDirDefaultsUnderTheDataDir(t *testing.T) {
	for _, tc := range []struct{ body, want string }{
		{"data_dir = \"/srv/skiff\"\n", "/srv/skiff/manifests"},
		{"data_dir = \"/srv/skiff\"\nserver {\n  manifests_dir = \"/etc/skiff/manifests\"\n}\n", "/etc/skiff/manifests"},
	} {
		s, err := LoadServer(writeFile(t, tc.body), nil)
		if err != nil {
			t.Fatal(err)
		}
		if s.ManifestsDir != tc.want {
			t.Errorf("%q: manifests dir %s, want %s", tc.body, s.ManifestsDir, tc.want)
		}
	}
}
