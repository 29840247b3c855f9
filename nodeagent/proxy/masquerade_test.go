package proxy

import (
	"context"
	"strings"
	"testing"
)

func TestMasqueradeRules(t *testing.T) {
	got := masqueradeRules("SKIFF-MASQ-0000abcd", "skiff:0000abcd:/d", []string{"10.244.0.0/24", "10.244.1.0/24"})
	want := `*nat
:SKIFF-MASQ-0000abcd - [0:0]
-A SKIFF-MASQ-0000abcd -m comment --comment "skiff:0000abcd:/d"
-A SKIFF-MASQ-0000abcd -d 10.244.0.0/24 -j RETURN
-A SKIFF-MASQ-0000abcd -d 10.244.1.0/24 -j RETURN
-A SKIFF-MASQ-0000abcd -d 224.0.0.0/4 -j RETURN
-A SKIFF-MASQ-0000abcd -j MASQUERADE
COMMIT
`
	if got != want {
		t.Fatalf("rules:\n%s\nwant:\n%s", got, want)
	}
	if c := MasqueradeChain("0000abcd"); len(c) > maxChainLen || chainOwnerID(c) != "0000abcd" {
		t.Fatalf("chain name %q", c)
	}
}

// The chain and its POSTROUTING jump on the real iptables, in a throwaway namespace.
func TestSyncAndRemoveMasquerade(t *testing.T) {
	ns := newTestNetns(t)
	ctx := context.Background()
	chain, owner := MasqueradeChain("0000abcd"), OwnerComment("0000abcd", t.TempDir())
	nat := func() string {
		var mine []string
		for _, line := range strings.Split(ns.exec(t, "iptables-save", "-t", "nat"), "\n") {
			if strings.Contains(line, chain) {
				mine = append(mine, line)
			}
		}
		return strings.Join(mine, "\n")
	}
	for _, cidrs := range [][]string{{"198.51.100.0/24"}, {"198.51.100.0/24", "198.51.101.0/24"}} {
		// Twice each: the sync is idempotent, one jump and one copy of each rule.
		for range 2 {
			if err := syncMasquerade(ctx, ns.cmds, chain, owner, "198.51.100.0/24", cidrs, false); err != nil {
				t.Fatal(err)
			}
		}
		got := nat()
		if n := strings.Count(got, "-A POSTROUTING -s 198.51.100.0/24"); n != 1 {
			t.Fatalf("%d POSTROUTING jumps:\n%s", n, got)
		}
		for _, cidr := range cidrs {
			if strings.Count(got, "-A "+chain+" -d "+cidr) != 1 {
				t.Fatalf("exemption of %s missing or repeated:\n%s", cidr, got)
			}
		}
		if !strings.HasSuffix(got, "-A "+chain+" -j MASQUERADE") {
			t.Fatalf("masquerade is not the last rule:\n%s", got)
		}
	}
	// keepExisting (a restarted agent before it knows the Nodes) leaves the exemptions alone.
	before := nat()
	if err := syncMasquerade(ctx, ns.cmds, chain, owner, "198.51.100.0/24", []string{"198.51.100.0/24"}, true); err != nil {
		t.Fatal(err)
	}
	if got := nat(); got != before {
		t.Fatalf("keepExisting changed the chain:\n%s\nwas:\n%s", got, before)
	}
	for range 2 { // idempotent
		if err := RemoveAll(ctx, ns.cmds, "0000abcd"); err != nil {
			t.Fatal(err)
		}
	}
	if got := nat(); got != "" {
		t.Fatalf("left after removal:\n%s", got)
	}
}
