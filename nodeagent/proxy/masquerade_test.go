package proxy

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

func TestMasqueradeRules(t *testing.T) {
	got := masqueradeRules("SKIFF-MASQ-0000abcd", "skiff:0000abcd:/d", []string{"10.244.0.0/24", "10.244.1.0/24"})
	want := `*nat
:SKIFF-MASQ-0000abcd - [0:0]
-A SKIFF-MASQ-0000abcd -m comment --comment "skiff:0000abcd:/d"
-A SKIFF-MASQ-0000abcd -m physdev --physdev-is-bridged -j RETURN
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

// Traffic another bridge on the host switches (with br_netfilter, it passes the host's POSTROUTING) is not
// masqueraded even when its source is in the node's pod CIDR: the pods of another cluster with the same pod
// CIDR, on a bridge of theirs, reach each other with their own addresses.
func TestMasqueradeLeavesBridgedTrafficAlone(t *testing.T) {
	if _, err := exec.LookPath("busybox"); err != nil {
		t.Skip("busybox not installed (make setup installs it)")
	}
	host, a, b := newTestNetns(t), newTestNetns(t), newTestNetns(t)
	if _, err := exec.Command("ip", "netns", "exec", host.name, "sysctl", "-qw", "net.bridge.bridge-nf-call-iptables=1").CombinedOutput(); err != nil {
		t.Skip("no br_netfilter here: bridged traffic does not pass iptables")
	}
	ctx := context.Background()
	chain := MasqueradeChain("0000abcd")
	if err := syncMasquerade(ctx, host.cmds, chain, OwnerComment("0000abcd", t.TempDir()), "10.244.0.0/24", []string{"10.244.0.0/24"}, false); err != nil {
		t.Fatal(err)
	}
	// Another cluster's bridge in the host: two "pods" of its, one of them in this node's pod CIDR.
	host.exec(t, "ip", "link", "add", "brother", "type", "bridge")
	host.exec(t, "ip", "addr", "add", "10.244.255.1/16", "dev", "brother")
	host.exec(t, "ip", "link", "set", "brother", "up")
	for i, pod := range []struct {
		ns *testNetns
		ip string
	}{{a, "10.244.0.5/16"}, {b, "10.244.1.5/16"}} {
		port := fmt.Sprintf("vpod%d", i)
		host.exec(t, "ip", "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", pod.ns.name)
		host.exec(t, "ip", "link", "set", port, "master", "brother", "up")
		pod.ns.exec(t, "ip", "addr", "add", pod.ip, "dev", "eth0")
		pod.ns.exec(t, "ip", "link", "set", "eth0", "up")
	}
	a.exec(t, "busybox", "ping", "-c", "1", "-W", "5", "10.244.1.5") // busybox-static: make setup installs it
	// packets counts what a rule whose target is target passed in a nat chain.
	packets := func(chainName, target string) (n int) {
		for _, line := range strings.Split(host.exec(t, "iptables", "-t", "nat", "-L", chainName, "-v", "-x", "-n"), "\n") {
			if f := strings.Fields(line); len(f) > 2 && f[2] == target {
				c, _ := strconv.Atoi(f[0])
				n += c
			}
		}
		return n
	}
	if packets("POSTROUTING", chain) == 0 {
		t.Fatalf("the bridged ping never reached %s: the test shows nothing", chain)
	}
	if n := packets(chain, "MASQUERADE"); n != 0 {
		t.Fatalf("%s masqueraded %d bridged packets", chain, n)
	}
}
