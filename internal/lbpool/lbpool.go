// Package lbpool holds the address pools LoadBalancer Services get their addresses from: the servers'
// `load_balancer` configuration, parsed and checked once, and asked which pool an address is in and which
// addresses a pool has, in order.
package lbpool

import (
	"fmt"
	"net/netip"
	"strings"
)

// DefaultPool is the pool of `load_balancer { pool = [...] }`, which Services that name none use.
const DefaultPool = "default"

// PoolAnnotation names the pool a Service wants its address from.
const PoolAnnotation = "skiff.dev/load-balancer-pool"

// Range is an inclusive range of IPv4 addresses.
type Range struct{ First, Last netip.Addr }

// Contains tells whether a is in the range.
func (r Range) Contains(a netip.Addr) bool { return r.First.Compare(a) <= 0 && a.Compare(r.Last) <= 0 }

// Overlaps tells whether two ranges share an address.
func (r Range) Overlaps(o Range) bool {
	return r.First.Compare(o.Last) <= 0 && o.First.Compare(r.Last) <= 0
}

func (r Range) String() string {
	if r.First == r.Last {
		return r.First.String()
	}
	return r.First.String() + "-" + r.Last.String()
}

// ParseRange reads a CIDR ("10.10.0.0/28": its addresses but the network and broadcast ones, for a prefix
// shorter than /31, which hosts on that network would take for their own) or a range ("10.10.0.5-10.10.0.9",
// or one address).
func ParseRange(s string) (Range, error) {
	s = strings.TrimSpace(s)
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil || !p.Addr().Is4() {
			return Range{}, fmt.Errorf("%q is not an IPv4 CIDR such as \"10.10.0.0/28\"", s)
		}
		if p != p.Masked() {
			return Range{}, fmt.Errorf("%q has host bits set; the network is %s", s, p.Masked())
		}
		first, last := p.Addr(), lastOf(p)
		if p.Bits() < 31 {
			first, last = first.Next(), last.Prev()
		}
		return Range{first, last}, nil
	}
	from, to, isRange := strings.Cut(s, "-")
	first, err := netip.ParseAddr(strings.TrimSpace(from))
	if err != nil || !first.Is4() {
		return Range{}, fmt.Errorf("%q is not an IPv4 address, range (\"10.10.0.5-10.10.0.9\") or CIDR", s)
	}
	last := first
	if isRange {
		if last, err = netip.ParseAddr(strings.TrimSpace(to)); err != nil || !last.Is4() {
			return Range{}, fmt.Errorf("%q is not an IPv4 address range such as \"10.10.0.5-10.10.0.9\"", s)
		}
		if last.Less(first) {
			return Range{}, fmt.Errorf("%q ends before it starts", s)
		}
	}
	return Range{first, last}, nil
}

// Network is every address of a prefix, network and broadcast included.
func Network(p netip.Prefix) Range { return Range{p.Masked().Addr(), lastOf(p)} }

func lastOf(p netip.Prefix) netip.Addr {
	b := p.Addr().As4()
	for i := p.Bits(); i < 32; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	return netip.AddrFrom4(b)
}

// Pool is a named list of ranges.
type Pool struct {
	Name   string
	Ranges []Range
}

// Pools are every configured pool, the default one (if any) first, then the others by name.
type Pools []Pool

// Pool returns the pool with this name.
func (ps Pools) Pool(name string) (Pool, bool) {
	for _, p := range ps {
		if p.Name == name {
			return p, true
		}
	}
	return Pool{}, false
}

// PoolOf names the pool an address is in.
func (ps Pools) PoolOf(a netip.Addr) (string, bool) {
	for _, p := range ps {
		for _, r := range p.Ranges {
			if r.Contains(a) {
				return p.Name, true
			}
		}
	}
	return "", false
}

// Names lists the pools' names.
func (ps Pools) Names() []string {
	names := make([]string, 0, len(ps))
	for _, p := range ps {
		names = append(names, p.Name)
	}
	return names
}

// Each calls f on each of the pool's addresses in order, until f returns false.
func (p Pool) Each(f func(netip.Addr) bool) {
	for _, r := range p.Ranges {
		for a := r.First; ; a = a.Next() {
			if !f(a) {
				return
			}
			if a == r.Last {
				break
			}
		}
	}
}
