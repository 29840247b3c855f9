package main

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"net"
	"os/exec"
	"regexp"
)

// The dev cluster's load balancer pool. `skiff dev` is one node on this machine, so the machine is its
// "outside": a LoadBalancer Service's address must answer here, which it does through the proxy's rules for
// traffic the machine sends (nat OUTPUT), whatever the address. The pool is a /28 of 198.18.0.0/15, which
// RFC 2544 sets aside for benchmarking and so no real network uses; which /28 depends on the data dir, and one
// that a route of the machine covers, or whose addresses the nat table already names (another dev cluster's
// Services), is passed over, so that two dev clusters on one machine do not share addresses.

var devPoolBase = binary.BigEndian.Uint32(net.ParseIP("198.18.0.0").To4())

const devPoolBlocks = 1 << (32 - 15 - 4) // /28s in the /15

// devLoadBalancerPool picks the pool for a dev cluster with this data dir.
func devLoadBalancerPool(dataDir string) string {
	var taken []net.IP
	if out, err := exec.Command("iptables-save", "-t", "nat").Output(); err == nil {
		for _, m := range regexp.MustCompile(`-d (198\.1[89]\.\d+\.\d+)`).FindAllStringSubmatch(string(out), -1) {
			taken = append(taken, net.ParseIP(m[1]))
		}
	}
	routes := routedNets()
	h := fnv.New32a()
	h.Write([]byte(dataDir))
	start := h.Sum32() % devPoolBlocks
	for i := uint32(0); i < devPoolBlocks; i++ {
		block := (start + i) % devPoolBlocks
		ip := make(net.IP, 4)
		binary.BigEndian.PutUint32(ip, devPoolBase+block*16)
		cidr := &net.IPNet{IP: ip, Mask: net.CIDRMask(28, 32)}
		if !overlapsAny(cidr, routes) && !containsAny(cidr, taken) {
			return cidr.String()
		}
	}
	return fmt.Sprintf("%s/28", net.IP(binary.BigEndian.AppendUint32(nil, devPoolBase+start*16)))
}

func containsAny(n *net.IPNet, ips []net.IP) bool {
	for _, ip := range ips {
		if n.Contains(ip) {
			return true
		}
	}
	return false
}

func overlapsAny(n *net.IPNet, nets []*net.IPNet) bool {
	for _, o := range nets {
		if o.Contains(n.IP) || n.Contains(o.IP) {
			return true
		}
	}
	return false
}

// routedNets are the destinations of this machine's routes other than the default one.
func routedNets() []*net.IPNet {
	out, err := exec.Command("ip", "-4", "route", "show", "table", "all").Output()
	if err != nil {
		return nil
	}
	var nets []*net.IPNet
	for _, m := range regexp.MustCompile(`(?m)^(?:\S+ )?(\d+\.\d+\.\d+\.\d+(?:/\d+)?) `).FindAllStringSubmatch(string(out), -1) {
		dst := m[1]
		if _, _, err := net.ParseCIDR(dst); err != nil {
			dst += "/32"
		}
		if _, n, err := net.ParseCIDR(dst); err == nil {
			nets = append(nets, n)
		}
	}
	return nets
}
