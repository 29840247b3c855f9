package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

// testProxy is a Proxy whose informer caches the test fills by hand.
func testProxy(t *testing.T, ns *testNetns, id, dataDir string) *Proxy {
	t.Helper()
	p, err := New(Config{NodeName: "node-a", ID: id, DataDir: dataDir, PodCIDR: "10.244.0.0/24", Commands: ns.cmds})
	if err != nil {
		t.Fatal(err)
	}
	p.services = cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	p.slices = cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	return p
}

func set(t *testing.T, idx cache.Indexer, objs ...any) {
	t.Helper()
	for _, o := range objs {
		if err := idx.Update(o); err != nil {
			t.Fatal(err)
		}
	}
}

// Rules on the real iptables: written, rewritten, stale chains deleted, removed with nothing left.
func TestSyncOnRealIPTables(t *testing.T) {
	ns := newTestNetns(t)
	ctx := context.Background()
	p := testProxy(t, ns, "0000abcd", t.TempDir())
	if !p.features.sctp {
		t.Log("no SCTP here; SCTP cases are skipped by the proxy")
	}
	// A LoadBalancer with an external IP and source ranges: every kind of rule iptables-restore must take.
	web := service("web", "10.96.0.10", nodePort(30080), func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.ExternalIPs = []string{"192.0.2.7"}
		s.Spec.LoadBalancerSourceRanges = []string{"203.0.113.0/24"}
		s.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.51.100.4"}}
	})
	db := service("db", "10.96.0.20")
	set(t, p.services, web, db)
	webSlice := slice("web", ep{ip: "10.244.0.5", node: "node-a"}, ep{ip: "10.244.1.5", node: "node-b"})
	set(t, p.slices, webSlice, slice("db", ep{ip: "10.244.0.9"}))
	if err := p.Sync(ctx, true); err != nil {
		t.Fatal(err)
	}
	saved := ns.save(t)
	for _, want := range []string{
		"-A PREROUTING -m comment --comment \"skiff:0000abcd:" + p.cfg.DataDir + "\" -j SKIFF-0000abcd-SVCS",
		"-A OUTPUT -m comment --comment \"skiff:0000abcd:" + p.cfg.DataDir + "\" -j SKIFF-0000abcd-SVCS",
		"-A POSTROUTING -m comment --comment \"skiff:0000abcd:" + p.cfg.DataDir + "\" -j SKIFF-0000abcd-POSTRTG",
		"-A FORWARD -m conntrack --ctstate NEW -m comment",
		"-j DNAT --to-destination 10.244.0.5:8080",
		"-j DNAT --to-destination 10.244.0.9:8080",
		"--dport 30080 -j SKIFF-0000abcd-MARK-MASQ",
		"-A SKIFF-0000abcd-SVCS -s 203.0.113.0/24 -d 198.51.100.4/32 -p tcp",
		"-A SKIFF-0000abcd-FILTER -d 198.51.100.4/32 -p tcp",
		"-A SKIFF-0000abcd-SVCS -d 192.0.2.7/32 -p tcp",
	} {
		if !strings.Contains(saved, want) {
			t.Errorf("missing %q in:\n%s", want, saved)
		}
	}
	dbChain := p.names.hashedChain(p.names.servicePfx, "0000abcd", "default/db:http", "tcp")
	if !strings.Contains(saved, ":"+dbChain) {
		t.Fatalf("no chain %s", dbChain)
	}

	// db deleted: its chains go in the next transaction; a second sync is idempotent (one jump each).
	if err := p.services.Delete(db); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := p.Sync(ctx, true); err != nil {
			t.Fatal(err)
		}
	}
	saved = ns.save(t)
	if strings.Contains(saved, dbChain) || strings.Contains(saved, "10.244.0.9") {
		t.Errorf("deleted Service's rules left:\n%s", saved)
	}
	if n := strings.Count(saved, "-A PREROUTING"); n != 1 {
		t.Errorf("%d PREROUTING jumps:\n%s", n, saved)
	}

	// A restarted agent (a new Proxy, no bookkeeping) rewrites the same chains in place.
	p2 := testProxy(t, ns, "0000abcd", p.cfg.DataDir)
	set(t, p2.services, web)
	set(t, p2.slices, webSlice)
	if err := p2.Sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	if again := ns.save(t); stripCounters(again) != stripCounters(saved) {
		t.Errorf("restart changed the rules:\n%s\nwas:\n%s", again, saved)
	}

	if err := p2.Remove(ctx); err != nil {
		t.Fatal(err)
	}
	if left := ns.save(t); strings.Contains(left, "SKIFF") {
		t.Errorf("left after Remove:\n%s", left)
	}
}

func stripCounters(s string) string { return strings.ReplaceAll(s, "[0:0]", "") }

// Real traffic through the rules: the namespace is the node, a second one is a pod with a TCP listener.
// A connection to the ClusterIP is answered by the pod; with no endpoints it is refused at once.
func TestTrafficThroughClusterIP(t *testing.T) {
	node := newTestNetns(t)
	pod := newTestNetns(t)
	veth := "vskp" + node.name[len(node.name)-6:]
	run(t, "ip", "link", "add", veth, "netns", node.name, "type", "veth", "peer", "name", "eth0", "netns", pod.name)
	node.exec(t, "ip", "addr", "add", "10.244.0.1/24", "dev", veth)
	node.exec(t, "ip", "link", "set", veth, "up")
	node.exec(t, "ip", "route", "add", "default", "via", "10.244.0.5") // ClusterIPs need a route before nat OUTPUT
	pod.exec(t, "ip", "addr", "add", "10.244.0.5/24", "dev", "eth0")
	pod.exec(t, "ip", "link", "set", "eth0", "up")
	pod.exec(t, "ip", "route", "add", "default", "via", "10.244.0.1")

	var ln net.Listener
	pod.do(t, func() {
		var err error
		if ln, err = net.Listen("tcp", "10.244.0.5:8080"); err != nil {
			t.Error(err)
		}
	})
	if ln == nil {
		t.FailNow()
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = io.WriteString(c, "hello from the pod\n")
			c.Close()
		}
	}()

	ctx := context.Background()
	p := testProxy(t, node, "0000abcd", t.TempDir())
	set(t, p.services, service("web", "10.96.0.10"))
	set(t, p.slices, slice("web", ep{ip: "10.244.0.5", node: "node-a"}))
	if err := p.Sync(ctx, true); err != nil {
		t.Fatal(err)
	}
	dial := func() (string, error) {
		var reply string
		var err error
		node.do(t, func() {
			var c net.Conn
			if c, err = net.DialTimeout("tcp", "10.96.0.10:80", 3*time.Second); err != nil {
				return
			}
			defer c.Close()
			var b []byte
			b, err = io.ReadAll(c)
			reply = string(b)
		})
		return reply, err
	}
	if reply, err := dial(); err != nil || reply != "hello from the pod\n" {
		t.Fatalf("through the ClusterIP: %q, %v\n%s", reply, err, node.save(t))
	}

	// No endpoints: REJECT, so the client fails at once instead of timing out.
	set(t, p.slices, slice("web"))
	if err := p.Sync(ctx, false); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := dial()
	if !errors.Is(err, syscall.ECONNREFUSED) || time.Since(start) > time.Second {
		t.Fatalf("without endpoints: %v after %s, want connection refused at once", err, time.Since(start))
	}
}

// Stale chains (the service proxy's, the masquerade chain and the network policy engine's): those of an agent
// whose lock is free, or whose data dir is gone, are removed; those of a live agent and the caller's own stay.
func TestRemoveStale(t *testing.T) {
	ns := newTestNetns(t)
	ctx := context.Background()
	liveDir, deadDir, goneDir := t.TempDir(), t.TempDir(), filepath.Join(t.TempDir(), "gone")
	own, err := Claim(liveDir, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer own.Release()
	if _, err := Claim(liveDir, 0); err == nil {
		t.Fatal("a second claim of a held data dir succeeded")
	}
	dead, err := Claim(deadDir, 0)
	if err != nil {
		t.Fatal(err)
	}
	dead.Release() // the agent died: the kernel dropped its lock
	for id, dir := range map[string]string{"1111aaaa": liveDir, "2222bbbb": deadDir, "3333cccc": goneDir, "4444dddd": t.TempDir()} {
		p := testProxy(t, ns, id, dir)
		set(t, p.services, service("web", "10.96.0.10"))
		set(t, p.slices, slice("web", ep{ip: "10.244.0.5"}))
		if err := p.Sync(ctx, true); err != nil {
			t.Fatal(err)
		}
		if err := syncMasquerade(ctx, ns.cmds, MasqueradeChain(id), OwnerComment(id, dir), "10.244.0.0/24", []string{"10.244.0.0/24"}, false); err != nil {
			t.Fatal(err)
		}
		// The network policy engine's chain (nodeagent/netpol), jumped from FORWARD with the owner comment.
		ns.exec(t, "iptables", "-N", "SKIFF-NP-"+id+"-FWD")
		ns.exec(t, "iptables", "-I", "FORWARD", "-m", "comment", "--comment", OwnerComment(id, dir), "-j", "SKIFF-NP-"+id+"-FWD")
	}
	// A chain from before owner comments: no owner named anywhere.
	ns.exec(t, "iptables", "-t", "nat", "-N", "SKIFF-MASQ-5555eeee")
	ns.exec(t, "iptables", "-t", "nat", "-A", "POSTROUTING", "-s", "10.244.9.0/24", "-m", "comment", "--comment", "skiff-pod-egress", "-j", "SKIFF-MASQ-5555eeee")

	removed, err := RemoveStale(ctx, ns.cmds, "4444dddd")
	if err != nil {
		t.Fatal(err)
	}
	saved := ns.save(t)
	for _, id := range []string{"2222bbbb", "3333cccc", "5555eeee"} {
		if strings.Contains(saved, id) {
			t.Errorf("stale %s left (removed %v):\n%s", id, removed, saved)
		}
	}
	for _, id := range []string{"1111aaaa", "4444dddd"} {
		if !strings.Contains(saved, "SKIFF-"+id+"-SVCS") || !strings.Contains(saved, "SKIFF-MASQ-"+id) || !strings.Contains(saved, "SKIFF-NP-"+id+"-FWD") {
			t.Errorf("%s's chains were removed:\n%s", id, saved)
		}
	}
	// Teardown of one agent takes its masquerade chain too, and nothing of the other's.
	if err := RemoveAll(ctx, ns.cmds, "4444dddd"); err != nil {
		t.Fatal(err)
	}
	if saved := ns.save(t); strings.Contains(saved, "4444dddd") || !strings.Contains(saved, "1111aaaa") {
		t.Errorf("after RemoveAll:\n%s", saved)
	}
}

// Run with informers: the first sync waits for the caches, a new Service is programmed within the minimum
// interval, and a clean stop removes the agent's service chains.
func TestRunWithInformers(t *testing.T) {
	ns := newTestNetns(t)
	client := fake.NewClientset(service("web", "10.96.0.10"), slice("web", ep{ip: "10.244.0.5"}),
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}, Spec: corev1.NodeSpec{PodCIDR: "10.244.0.0/24"}})
	p, err := New(Config{NodeName: "node-a", ID: "0000abcd", DataDir: t.TempDir(), Client: client,
		MinSyncInterval: 100 * time.Millisecond, FullSyncInterval: time.Hour, Commands: ns.cmds})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, ns, "--to-destination 10.244.0.5:8080")
	waitFor(t, ns, "! -s 10.244.0.0/24 -d 10.96.0.10/32") // the pod CIDR came from the Node

	if _, err := client.CoreV1().Services("default").Create(ctx, service("db", "10.96.0.20"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ns, "-d 10.96.0.20/32 -p tcp -m comment --comment \"default/db:http\" -m tcp --dport 80 -j REJECT")

	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	done <- nil // for the cleanup's receive
	if saved := ns.save(t); strings.Contains(saved, "SKIFF") {
		t.Errorf("left after a clean stop:\n%s", saved)
	}
}

// waitFor polls iptables-save until it holds want, for up to 5 s.
func waitFor(t *testing.T, ns *testNetns, want string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		saved := ns.save(t)
		if strings.Contains(saved, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %q within 5 s:\n%s", want, saved)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
