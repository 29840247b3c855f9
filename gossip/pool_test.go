package gossip

import (
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/memberlist"

	"github.com/skiff-dev/skiff/internal/freeport"
)

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestJoinMetadataEventsAndLeave(t *testing.T) {
	key := "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=" // 32 bytes, base64
	ports := []int{freeport.One(t), freeport.One(t), freeport.One(t)}
	join := []string{fmt.Sprintf("127.0.0.1:%d", ports[0])}
	var pools []*Pool
	for i, port := range ports {
		p, err := New(Config{
			Name: fmt.Sprintf("m%d", i), BindAddr: "127.0.0.1", BindPort: port, RetryJoin: join,
			RetryInterval: 50 * time.Millisecond, EncryptKey: key, Local: true,
			Meta: Meta{Role: RoleServer, RaftAddr: fmt.Sprintf("127.0.0.1:%d", 10000+i), BootstrapExpect: 3},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Shutdown()
		pools = append(pools, p)
	}
	events, cancel := pools[0].Subscribe()
	defer cancel()
	waitFor(t, "three alive servers everywhere", func() bool {
		for _, p := range pools {
			if len(p.Alive(RoleServer)) != 3 {
				return false
			}
		}
		return true
	})
	m, ok := pools[1].Member("m2")
	if !ok || m.Meta.RaftAddr != "127.0.0.1:10002" || m.Meta.BootstrapExpect != 3 {
		t.Fatalf("metadata of m2 as seen by m1: %+v", m)
	}
	if err := pools[2].UpdateMeta(Meta{Role: RoleServer, RaftAddr: "127.0.0.1:20002", BootstrapExpect: 3}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "metadata update", func() bool {
		m, _ := pools[0].Member("m2")
		return m.Meta.RaftAddr == "127.0.0.1:20002"
	})
	if err := pools[2].Leave(time.Second); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "m2 to have left", func() bool {
		m, _ := pools[0].Member("m2")
		return m.Status == StatusLeft
	})
	sawLeave := false
	for !sawLeave {
		select {
		case ev := <-events:
			sawLeave = ev.Type == EventLeave && ev.Member.Name == "m2"
		case <-time.After(5 * time.Second):
			t.Fatal("no leave event")
		}
	}
}

func TestWrongEncryptionKeyCannotJoin(t *testing.T) {
	a, b := freeport.One(t), freeport.One(t)
	p1, err := New(Config{Name: "a", BindAddr: "127.0.0.1", BindPort: a, Local: true, EncryptKey: "MDEyMzQ1Njc4OWFiY2RlZg=="})
	if err != nil {
		t.Fatal(err)
	}
	defer p1.Shutdown()
	p2, err := New(Config{Name: "b", BindAddr: "127.0.0.1", BindPort: b, Local: true, EncryptKey: "ZmVkY2JhOTg3NjU0MzIxMA==",
		RetryJoin: []string{fmt.Sprintf("127.0.0.1:%d", a)}, RetryInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer p2.Shutdown()
	time.Sleep(500 * time.Millisecond) // give the join attempts time to fail; success would show up below
	if len(p1.Alive("")) != 1 {
		t.Fatalf("a member with another key joined: %+v", p1.Alive(""))
	}
	if _, err := New(Config{Name: "c", BindAddr: "127.0.0.1", BindPort: freeport.One(t), EncryptKey: "not base64!"}); err == nil {
		t.Fatal("bad key accepted")
	}
}

// TestRejoinThroughRememberedPeers: a member that joined through B remembers A too, and after a restart,
// with B gone, rejoins through A although its retry_join names only B.
func TestRejoinThroughRememberedPeers(t *testing.T) {
	peers := filepath.Join(t.TempDir(), "peers.json")
	a, b, c := freeport.One(t), freeport.One(t), freeport.One(t)
	addr := func(port int) string { return fmt.Sprintf("127.0.0.1:%d", port) }
	start := func(name string, port int, join []string, peersFile string) *Pool {
		t.Helper()
		p, err := New(Config{Name: name, BindAddr: "127.0.0.1", BindPort: port, RetryJoin: join, RetryInterval: 50 * time.Millisecond,
			Local: true, PeersFile: peersFile, Meta: Meta{Role: RoleAgent}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Shutdown() })
		return p
	}
	start("a", a, nil, "")
	pb := start("b", b, []string{addr(a)}, "")
	// c must join a b that already knows a: a c that joined first learns of a only by gossip that b may have
	// finished sending, or by the next push/pull, 15 s away.
	waitFor(t, "b to see a", func() bool { return len(pb.Alive("")) == 2 })
	pc := start("c", c, []string{addr(b)}, peers)
	waitFor(t, "c to see a and b", func() bool { return len(pc.Alive("")) == 3 })
	waitFor(t, "c's peers file to list a and b", func() bool {
		got := readPeers(peers)
		return len(got) == 2 && slices.Contains(got, addr(a)) && slices.Contains(got, addr(b))
	})
	pc.Shutdown()
	pb.Shutdown()
	again := start("c", c, []string{addr(b)}, peers)
	select {
	case <-again.Joined():
	case <-time.After(10 * time.Second):
		t.Fatal("the restarted member did not rejoin through the remembered peer")
	}
	if _, ok := again.Member("a"); !ok {
		t.Fatal("rejoined, but a is not in the member table")
	}
}

func TestJoinAddresses(t *testing.T) {
	cases := []struct {
		retryJoin, remembered, want []string
	}{
		{[]string{"s1:1", "s2:1"}, []string{"s2:1", "me:1", "a1:1"}, []string{"s1:1", "s2:1", "a1:1"}},
		{[]string{"s1:1"}, []string{"a1:1", "a2:1", "a3:1", "a4:1", "a5:1"}, []string{"s1:1", "a1:1", "a2:1", "a3:1"}},
		{[]string{"s1:1"}, nil, []string{"s1:1"}},
	}
	for _, tc := range cases {
		if got := joinAddresses(tc.retryJoin, tc.remembered, "me:1"); !slices.Equal(got, tc.want) {
			t.Errorf("joinAddresses(%v, %v) = %v, want %v", tc.retryJoin, tc.remembered, got, tc.want)
		}
	}
}

// TestReconnectToFailedMember: a member that saw another fail keeps trying its address, so when it is back
// (here restarted with nothing to join, as after a partition both sides have forgotten each other) the two
// find each other again.
func TestReconnectToFailedMember(t *testing.T) {
	a, b := freeport.One(t), freeport.One(t)
	start := func(name string, port int, join []string) *Pool {
		t.Helper()
		p, err := New(Config{Name: name, BindAddr: "127.0.0.1", BindPort: port, RetryJoin: join, RetryInterval: 50 * time.Millisecond,
			ReconnectInterval: 200 * time.Millisecond, Local: true, Meta: Meta{Role: RoleAgent}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Shutdown() })
		return p
	}
	pa := start("a", a, nil)
	pb := start("b", b, []string{fmt.Sprintf("127.0.0.1:%d", a)})
	waitFor(t, "a to see b", func() bool { return len(pa.Alive("")) == 2 })
	pb.Shutdown()
	waitFor(t, "a to see b fail", func() bool { m, _ := pa.Member("b"); return m.Status == StatusDead })
	again := start("b", b, nil)
	waitFor(t, "a and the restarted b to reconnect", func() bool { return len(pa.Alive("")) == 2 && len(again.Alive("")) == 2 })
}

// Reachable answers for the member as it is now, not as this member's view holds it: a member held as failed
// that answers is reachable; a member that is gone is not.
func TestReachableConfirmsAFailure(t *testing.T) {
	a, b := freeport.One(t), freeport.One(t)
	start := func(name string, port int, join []string) *Pool {
		t.Helper()
		p, err := New(Config{Name: name, BindAddr: "127.0.0.1", BindPort: port, RetryJoin: join, RetryInterval: 50 * time.Millisecond,
			ReconnectInterval: time.Hour, Local: true, Meta: Meta{Role: RoleAgent}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Shutdown() })
		return p
	}
	pa := start("a", a, nil)
	pb := start("b", b, []string{fmt.Sprintf("127.0.0.1:%d", a)})
	waitFor(t, "a to see b", func() bool { return len(pa.Alive("")) == 2 })
	if !pa.Reachable("b") {
		t.Fatal("an alive member is not reachable")
	}
	if pa.Reachable("nobody") {
		t.Fatal("an unknown member is reachable")
	}
	if ok, how := pa.probe("b"); !ok || how != probeAnswered {
		t.Fatalf("an alive member's probe: %v, %s", ok, how)
	}
	pb.Shutdown()
	waitFor(t, "a to see b fail", func() bool { m, _ := pa.Member("b"); return m.Status == StatusDead })
	// Nothing listens on b's port now: the refused connection decides, without waiting out the pings.
	if ok, how := pa.probe("b"); ok || how != probeRefused {
		t.Fatalf("a stopped member's probe: %v, %s; want refused", ok, how)
	}
	start("b", b, nil) // back at the same address, joining nobody: a's view of it is stale
	// The view does not stay stale on its own: a keeps gossiping to the dead for a while, and b refutes its
	// death once that reaches it. So the stale view is set here, and a probe counts only if the view stayed
	// stale until it returned; once memberlist has b alive again, nothing turns it back.
	staleNode := &memberlist.Node{Name: "b", Addr: net.ParseIP("127.0.0.1"), Port: uint16(b)}
	for try := 0; ; try++ {
		pa.record(EventLeave, staleNode)
		reachable := pa.Reachable("b")
		if m, _ := pa.Member("b"); m.Status == StatusDead {
			if !reachable {
				t.Fatal("a member held as failed that answers is not reachable")
			}
			return
		}
		if try == 10 {
			t.Fatal("b's view never stayed stale through a probe")
		}
	}
}

// TestLeaveIntentOrdering: a member that announced its leave is "left" whichever of the intent and
// memberlist's leave arrives first; an intent from an earlier run of the member does not apply to the next.
func TestLeaveIntentOrdering(t *testing.T) {
	newPool := func() *Pool {
		return &Pool{logger: hclog.NewNullLogger(), members: map[string]Member{}, subs: map[chan Event]struct{}{}, leaveIntents: map[string]string{}}
	}
	node := func(boot string) *memberlist.Node {
		meta, _ := json.Marshal(Meta{Role: RoleAgent, BootID: boot})
		return &memberlist.Node{Name: "a", Addr: net.ParseIP("127.0.0.1"), Port: 7946, Meta: meta}
	}
	intent := func(boot string) []byte {
		b, _ := json.Marshal(leaveIntent{Name: "a", BootID: boot})
		return b
	}
	status := func(p *Pool) Status { m, _ := p.Member("a"); return m.Status }

	p := newPool() // the leave overtakes the intent
	p.record(EventJoin, node("run-1"))
	p.record(EventLeave, node("run-1"))
	if got := status(p); got != StatusDead {
		t.Fatalf("before the intent: %s, want dead", got)
	}
	p.receiveLeaveIntent(intent("run-1"))
	if got := status(p); got != StatusLeft {
		t.Fatalf("after the intent: %s, want left", got)
	}

	p = newPool() // the intent first
	p.record(EventJoin, node("run-1"))
	p.receiveLeaveIntent(intent("run-1"))
	p.record(EventLeave, node("run-1"))
	if got := status(p); got != StatusLeft {
		t.Fatalf("intent, then leave: %s, want left", got)
	}
	p.record(EventJoin, node("run-2")) // the member restarts, then fails
	p.record(EventLeave, node("run-2"))
	if got := status(p); got != StatusDead {
		t.Fatalf("the next run failing: %s, want dead", got)
	}
	p.receiveLeaveIntent(intent("run-1")) // a late intent of the earlier run
	if got := status(p); got != StatusDead {
		t.Fatalf("a stale intent: %s, want dead", got)
	}
}

// TestMembersLeavingTogether has three of four members leave at once: each announces its leave to the others
// while their own announcements update its memberlist's view of them, which the race detector flagged when
// the leave intent was sent to memberlist's own node records. The fourth sees every one of them as left.
func TestMembersLeavingTogether(t *testing.T) {
	var pools []*Pool
	var join []string
	for i := 0; i < 4; i++ {
		port := freeport.One(t)
		// Each joins every member before it (push-pull with each), so that all see all at once rather than
		// at the next periodic push-pull.
		join = append(join, fmt.Sprintf("127.0.0.1:%d", port))
		p, err := New(Config{
			Name: fmt.Sprintf("m%d", i), BindAddr: "127.0.0.1", BindPort: port, RetryJoin: slices.Clone(join),
			RetryInterval: 50 * time.Millisecond, Local: true, Meta: Meta{Role: RoleServer},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Shutdown() })
		pools = append(pools, p)
	}
	waitFor(t, "four alive members everywhere", func() bool {
		for _, p := range pools {
			if len(p.Alive("")) != 4 {
				return false
			}
		}
		return true
	})
	done := make(chan error, 3)
	for _, p := range pools[1:] {
		go func() { done <- p.Leave(time.Second) }()
	}
	for range pools[1:] {
		if err := <-done; err != nil {
			t.Errorf("leave: %v", err)
		}
	}
	waitFor(t, "m1, m2 and m3 to have left", func() bool {
		for _, name := range []string{"m1", "m2", "m3"} {
			if m, _ := pools[0].Member(name); m.Status != StatusLeft {
				return false
			}
		}
		return true
	})
}
