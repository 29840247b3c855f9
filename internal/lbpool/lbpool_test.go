package lbpool

import (
	"net/netip"
	"testing"
)

func TestParseRange(t *testing.T) {
	for in, want := range map[string]string{
		"10.10.0.0/28":                    "10.10.0.1-10.10.0.14",
		"10.10.0.4/31":                    "10.10.0.4-10.10.0.5",
		"10.10.0.9/32":                    "10.10.0.9",
		" 10.10.0.5-10.10.0.9 ":           "10.10.0.5-10.10.0.9",
		"10.10.0.5 - 10.10.0.5":           "10.10.0.5",
		"192.0.2.7":                       "192.0.2.7",
		"10.10.0.255-10.10.1.1":           "10.10.0.255-10.10.1.1",
		"10.10.0.0/30":                    "10.10.0.1-10.10.0.2",
		"192.168.100.200-192.168.100.250": "192.168.100.200-192.168.100.250",
	} {
		r, err := ParseRange(in)
		if err != nil || r.String() != want {
			t.Errorf("ParseRange(%q) = %v, %v; want %s", in, r, err, want)
		}
	}
	for _, bad := range []string{"", "10.10.0.1/28", "10.10.0.0/33", "fd00::/120", "10.10.0.9-10.10.0.5", "10.10.0.5-", "a-b", "::1"} {
		if r, err := ParseRange(bad); err == nil {
			t.Errorf("ParseRange(%q) = %v, want an error", bad, r)
		}
	}
}

func TestPools(t *testing.T) {
	mustRange := func(s string) Range {
		r, err := ParseRange(s)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	ps := Pools{{Name: DefaultPool, Ranges: []Range{mustRange("10.10.0.0/30"), mustRange("10.10.1.7")}}, {Name: "edge", Ranges: []Range{mustRange("192.0.2.10-192.0.2.11")}}}
	var got []string
	p, _ := ps.Pool(DefaultPool)
	p.Each(func(a netip.Addr) bool { got = append(got, a.String()); return true })
	if want := "[10.10.0.1 10.10.0.2 10.10.1.7]"; fmtList(got) != want {
		t.Fatalf("default pool addresses %v, want %s", got, want)
	}
	got = nil
	p.Each(func(a netip.Addr) bool { got = append(got, a.String()); return len(got) < 2 })
	if len(got) != 2 {
		t.Fatalf("Each went on after false: %v", got)
	}
	if name, ok := ps.PoolOf(netip.MustParseAddr("192.0.2.11")); !ok || name != "edge" {
		t.Fatalf("PoolOf 192.0.2.11 = %q %v", name, ok)
	}
	if _, ok := ps.PoolOf(netip.MustParseAddr("10.10.0.3")); ok {
		t.Fatal("10.10.0.3, the /30's broadcast address, is in a pool")
	}
	if !mustRange("10.0.0.0/24").Overlaps(mustRange("10.0.0.200-10.0.1.5")) || mustRange("10.0.0.0/24").Overlaps(mustRange("10.0.1.1")) {
		t.Fatal("Overlaps")
	}
}

func fmtList(s []string) string {
	out := "["
	for i, x := range s {
		if i > 0 {
			out += " "
		}
		out += x
	}
	return out + "]"
}
