package servicecidr

import "testing"

func TestKubernetesServiceIP(t *testing.T) {
	cases := []struct {
		name, cidr, want string // want "" for an error
	}{
		{name: "the default", cidr: "10.96.0.0/16", want: "10.96.0.1"},
		{name: "a host address inside the CIDR", cidr: "10.96.7.9/16", want: "10.96.0.1"},
		{name: "a small CIDR", cidr: "192.168.5.16/28", want: "192.168.5.17"},
		{name: "a /31", cidr: "172.16.0.254/31", want: "172.16.0.255"},
		{name: "a /32", cidr: "172.16.0.255/32"},
		{name: "IPv6", cidr: "fd00::/108"},
		{name: "empty", cidr: ""},
		{name: "not a CIDR", cidr: "10.96.0.0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ip, err := KubernetesServiceIP(tc.cidr)
			switch {
			case tc.want == "" && err == nil:
				t.Fatalf("KubernetesServiceIP(%q) = %v, want an error", tc.cidr, ip)
			case tc.want != "" && err != nil:
				t.Fatalf("KubernetesServiceIP(%q): %v", tc.cidr, err)
			case tc.want != "" && ip.String() != tc.want:
				t.Fatalf("KubernetesServiceIP(%q) = %v, want %s", tc.cidr, ip, tc.want)
			}
		})
	}
}
