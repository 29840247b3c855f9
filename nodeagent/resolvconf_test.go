package nodeagent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestPodResolvConf(t *testing.T) {
	host := parseResolvConf([]byte("# the node's\nnameserver 192.0.2.53\nnameserver 192.0.2.54 # second\nsearch corp.example. lab.example\noptions timeout:2 rotate\n"))
	cluster := clusterDNS{IP: "10.96.0.10", Domain: "cluster.local"}
	clusterSearch := "search ns.svc.cluster.local svc.cluster.local cluster.local corp.example lab.example\n"
	hostFile := "nameserver 192.0.2.53\nnameserver 192.0.2.54\nsearch corp.example lab.example\noptions timeout:2 rotate\n"
	cases := []struct {
		name    string
		spec    corev1.PodSpec
		cluster clusterDNS
		want    string
	}{
		{"ClusterFirst", corev1.PodSpec{DNSPolicy: corev1.DNSClusterFirst}, cluster,
			"nameserver 10.96.0.10\n" + clusterSearch + "options ndots:5\n"},
		{"empty policy is ClusterFirst", corev1.PodSpec{}, cluster, "nameserver 10.96.0.10\n" + clusterSearch + "options ndots:5\n"},
		{"ClusterFirst on the host network is Default", corev1.PodSpec{DNSPolicy: corev1.DNSClusterFirst, HostNetwork: true}, cluster, hostFile},
		{"ClusterFirstWithHostNet", corev1.PodSpec{DNSPolicy: corev1.DNSClusterFirstWithHostNet, HostNetwork: true}, cluster,
			"nameserver 10.96.0.10\n" + clusterSearch + "options ndots:5\n"},
		{"Default", corev1.PodSpec{DNSPolicy: corev1.DNSDefault}, cluster, hostFile},
		{"None without dnsConfig", corev1.PodSpec{DNSPolicy: corev1.DNSNone}, cluster, ""},
		{"None with dnsConfig", corev1.PodSpec{DNSPolicy: corev1.DNSNone, DNSConfig: &corev1.PodDNSConfig{
			Nameservers: []string{"1.1.1.1"}, Searches: []string{"a.example"}, Options: []corev1.PodDNSConfigOption{{Name: "ndots", Value: ptr("2")}, {Name: "edns0"}}}},
			cluster, "nameserver 1.1.1.1\nsearch a.example\noptions ndots:2 edns0\n"},
		{"ClusterFirst without a known cluster DNS uses the node's", corev1.PodSpec{DNSPolicy: corev1.DNSClusterFirst}, clusterDNS{}, hostFile},
		{"dnsConfig merged into ClusterFirst", corev1.PodSpec{DNSConfig: &corev1.PodDNSConfig{
			Nameservers: []string{"1.1.1.1", "10.96.0.10"}, Searches: []string{"svc.cluster.local", "extra.example"},
			Options: []corev1.PodDNSConfigOption{{Name: "ndots", Value: ptr("1")}, {Name: "single-request-reopen"}}}}, cluster,
			"nameserver 10.96.0.10\nnameserver 1.1.1.1\nsearch ns.svc.cluster.local svc.cluster.local cluster.local corp.example lab.example extra.example\n" +
				"options ndots:1 single-request-reopen\n"},
		{"at most three nameservers", corev1.PodSpec{DNSPolicy: corev1.DNSDefault, DNSConfig: &corev1.PodDNSConfig{Nameservers: []string{"1.1.1.1", "8.8.8.8"}}}, cluster,
			"nameserver 192.0.2.53\nnameserver 192.0.2.54\nnameserver 1.1.1.1\nsearch corp.example lab.example\noptions timeout:2 rotate\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "ns"}, Spec: tc.spec}
			if got := podResolvConf(pod, host, tc.cluster).String(); got != tc.want {
				t.Errorf("resolv.conf:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}

func TestPodResolvConfSearchLimits(t *testing.T) {
	var searches []string
	for i := 0; i < 40; i++ {
		searches = append(searches, strings.Repeat("x", 60)+string(rune('a'+i%26))+strings.Repeat("y", i))
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns"}, Spec: corev1.PodSpec{DNSPolicy: corev1.DNSNone,
		DNSConfig: &corev1.PodDNSConfig{Searches: searches}}}
	rc := podResolvConf(pod, resolvConf{}, clusterDNS{})
	if len(rc.searches) > maxDNSSearches || len(strings.Join(rc.searches, " ")) > maxDNSSearchListChar || len(rc.searches) == 0 {
		t.Errorf("%d search domains, %d characters", len(rc.searches), len(strings.Join(rc.searches, " ")))
	}
}

// The hosts file's fully qualified name follows the cluster domain.
func TestPodHostsUsesTheClusterDomain(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pod")
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: "ns"}, Spec: corev1.PodSpec{Subdomain: "web"}}
	if err := writePodDNSFiles(dir, pod, "10.42.0.5", "web-0", clusterDNS{IP: "10.96.0.10", Domain: "corp.internal"}); err != nil {
		t.Fatal(err)
	}
	hosts, err := os.ReadFile(filepath.Join(dir, "etc-hosts"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(hosts), "10.42.0.5\tweb-0.web.ns.svc.corp.internal\tweb-0\n") {
		t.Errorf("hosts:\n%s", hosts)
	}
	resolv, _ := os.ReadFile(filepath.Join(dir, "etc-resolv.conf"))
	if !strings.HasPrefix(string(resolv), "nameserver 10.96.0.10\nsearch ns.svc.corp.internal svc.corp.internal corp.internal") {
		t.Errorf("resolv.conf:\n%s", resolv)
	}
}
