package main

import (
	"net"
	"testing"
)

// TestDevLoadBalancerPool: a /28 of 198.18.0.0/15, the same for the same data dir, and different ones for
// different dirs (most of the time; a clash is passed over only when one dev cluster's Services name it).
func TestDevLoadBalancerPool(t *testing.T) {
	_, bench, _ := net.ParseCIDR("198.18.0.0/15")
	a, b := devLoadBalancerPool("/tmp/skiff-dev-a"), devLoadBalancerPool("/tmp/skiff-dev-b")
	for _, p := range []string{a, b} {
		ip, n, err := net.ParseCIDR(p)
		if err != nil || !bench.Contains(ip) || n.Mask.String() != net.CIDRMask(28, 32).String() || !ip.Equal(n.IP) {
			t.Errorf("pool %q: want a /28 of 198.18.0.0/15", p)
		}
	}
	if a == b {
		t.Errorf("two data dirs got the same pool %s", a)
	}
	if again := devLoadBalancerPool("/tmp/skiff-dev-a"); again != a {
		t.Errorf("the same data dir got %s, then %s", a, again)
	}
	if !overlapsAny(mustCIDR(t, "198.18.0.16/28"), []*net.IPNet{mustCIDR(t, "198.18.0.0/16")}) ||
		overlapsAny(mustCIDR(t, "198.18.0.16/28"), []*net.IPNet{mustCIDR(t, "198.18.0.0/28")}) {
		t.Error("overlapsAny")
	}
}

func mustCIDR(t *testing.T, s string) *net.IPNet {
	_, n, err := net.ParseCIDR(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
