package dns

import (
	"slices"
	"strings"
	"testing"

	"github.com/coredns/coredns/core/dnsserver"
)

func TestRenderDefaultCorefile(t *testing.T) {
	out, err := Render(DefaultCorefile, Params{ClusterDomain: "corp.example", Bind: "10.244.3.1", Port: 53,
		Kubeconfig: "/var/lib/skiff/dns/kubeconfig", HealthAddr: "10.244.3.1:8080", MetricsAddr: "10.244.3.1:9153", Upstream: "/etc/resolv.conf"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{".:53 {", "bind 10.244.3.1", "health 10.244.3.1:8080", "kubernetes corp.example in-addr.arpa ip6.arpa {",
		"kubeconfig /var/lib/skiff/dns/kubeconfig", "pods insecure", "fallthrough in-addr.arpa ip6.arpa", "ttl 30",
		"prometheus 10.244.3.1:9153", "forward . /etc/resolv.conf", "cache 30"} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("rendered Corefile lacks %q:\n%s", want, out)
		}
	}
	if err := Validate(DefaultCorefile); err != nil {
		t.Errorf("the default Corefile does not validate: %v", err)
	}
}

func TestValidateReportsTheCorefileLine(t *testing.T) {
	cases := []struct{ name, corefile, want string }{
		{"unknown plugin", ".:53 {\n    bind {{.Bind}}\n    rewrite name a b\n}\n", "Corefile line 3: Unknown directive 'rewrite'"},
		{"unclosed plugin block", ".:53 {\n    kubernetes {{.ClusterDomain}} {\n        pods insecure\n", "Corefile line 3: Unexpected EOF"},
		{"unknown placeholder", ".:53 {\n    bind {{.Address}}\n}\n", "Corefile line 2: "},
		{"bad template", ".:53 {\n    errors\n    bind {{.Bind}\n}\n", "Corefile line 3: "},
		{"empty", "# nothing\n", "Corefile: has no server block"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate(tc.corefile)
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("error %v, want one starting %q", err, tc.want)
			}
		})
	}
}

// The plugins the package imports are the ones it enables, and in CoreDNS's own order.
func TestPluginsFollowCoreDNSOrder(t *testing.T) {
	if err := setup(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(dnsserver.Directives, Plugins) {
		t.Fatalf("directives %v, want %v", dnsserver.Directives, Plugins)
	}
	// zdirectives.go is CoreDNS's generated order; Plugins must be a subsequence of it.
	upstream := []string{"root", "metadata", "geoip", "cancel", "proxyproto", "quic", "grpc_server", "https", "https3", "timeouts",
		"multisocket", "reload", "nsid", "bufsize", "bind", "debug", "trace", "ready", "health", "pprof", "shed", "prometheus",
		"errors", "log", "dnstap", "local", "dns64", "siit", "any", "chaos", "loadbalance", "tsig", "rewrite", "autopath", "acl",
		"cache", "header", "dnssec", "tls", "minimal", "template", "transfer", "dynupdate", "hosts", "route53", "azure",
		"clouddns", "k8s_external", "kubernetes", "file", "auto", "secondary", "etcd", "loop", "forward"}
	last := -1
	for _, p := range Plugins {
		i := slices.Index(upstream, p)
		if i <= last {
			t.Fatalf("plugin %s out of CoreDNS's order", p)
		}
		last = i
	}
}

// A plugin argument error, which only the plugin's setup finds, comes back from Start with its line.
func TestStartReportsPluginErrorsWithTheLine(t *testing.T) {
	_, err := Start(".:0 {\n    bind 127.0.0.1\n    forward\n}\n", nil)
	if err == nil || !strings.HasPrefix(err.Error(), "Corefile line 3: ") {
		t.Fatalf("error %v, want one at Corefile line 3", err)
	}
	if !strings.Contains(err.Error(), "plugin/forward") {
		t.Errorf("error %v does not name the plugin", err)
	}
}
