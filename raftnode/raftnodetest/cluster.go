// Package raftnodetest runs in-process Raft clusters for tests: real TCP on loopback, real raft-boltdb in
// temp dirs, short timeouts, and a network layer that can partition peers. Later packages build their
// multi-peer tests on it.
package raftnodetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/skiff-dev/skiff/fsm"
	"github.com/skiff-dev/skiff/raftnode"

	"github.com/skiff-dev/skiff/internal/freeport"
)

// Cluster is a set of in-process peers.
type Cluster struct {
	t     testing.TB
	Net   *Network
	cfgs  []raftnode.Config
	mu    sync.Mutex
	nodes []*raftnode.Node // nil while a peer is stopped
}

// Option changes every peer's configuration before start.
type Option func(*raftnode.Config)

// TestCluster starts n bootstrapped peers and waits for a leader. Everything is torn down by t.Cleanup.
func TestCluster(t testing.TB, n int, opts ...Option) *Cluster {
	t.Helper()
	c := &Cluster{t: t, Net: NewNetwork(), nodes: make([]*raftnode.Node, n)}
	var servers []raftnode.Server
	for i := 0; i < n; i++ {
		cfg := raftnode.DefaultConfig()
		cfg.ID = fmt.Sprintf("peer-%d", i)
		cfg.DataDir = t.TempDir()
		cfg.BindAddr = fmt.Sprintf("127.0.0.1:%d", freeport.One(t))
		// Fast, but with room for a leader starved of CPU (the race detector, the other packages of `make
		// test` on two cores): at 100/50 ms leases lapsed between an election and the next write.
		cfg.HeartbeatTimeout = 200 * time.Millisecond
		cfg.ElectionTimeout = 200 * time.Millisecond
		cfg.LeaderLeaseTimeout = 100 * time.Millisecond
		cfg.CommitTimeout = 5 * time.Millisecond
		cfg.ApplyTimeout = 5 * time.Second
		cfg.TTLInterval = 50 * time.Millisecond
		cfg.Logger = hclog.New(&hclog.LoggerOptions{Name: cfg.ID, Level: hclog.Warn, Output: testWriter{t}})
		for _, o := range opts {
			o(&cfg)
		}
		cfg.Layer = c.Net.Layer(cfg.BindAddr)
		c.cfgs = append(c.cfgs, cfg)
		servers = append(servers, raftnode.Server{ID: cfg.ID, Address: cfg.BindAddr})
	}
	t.Cleanup(c.StopAll)
	// Cleanups run last-in first-out: dials a test left held end before the peers stop.
	t.Cleanup(c.Net.ReleaseAll)
	for i := range c.cfgs {
		c.Start(i)
		if err := c.Node(i).Bootstrap(servers); err != nil {
			t.Fatalf("bootstrap %d: %v", i, err)
		}
	}
	// Wait until the leader's barrier (a no-op of its term) has applied, so that tests counting revisions
	// start from a quiet store.
	leader := c.WaitForLeader()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Node(leader).LinearizableRead(ctx); err != nil {
		t.Fatalf("leader not ready: %v", err)
	}
	return c
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) { w.t.Logf("%s", p); return len(p), nil }

// Size returns the number of peers, running or not.
func (c *Cluster) Size() int { return len(c.cfgs) }

// Config returns peer i's configuration.
func (c *Cluster) Config(i int) raftnode.Config { return c.cfgs[i] }

// Node returns peer i, or nil while it is stopped.
func (c *Cluster) Node(i int) *raftnode.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[i]
}

// Start starts (or restarts) peer i from its data dir.
func (c *Cluster) Start(i int) {
	c.t.Helper()
	var n *raftnode.Node
	var err error
	// A just-closed listener's port can take a moment to free up.
	for attempt := 0; attempt < 50; attempt++ {
		if n, err = raftnode.New(c.cfgs[i]); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		c.t.Fatalf("starting peer %d: %v", i, err)
	}
	c.mu.Lock()
	c.nodes[i] = n
	c.mu.Unlock()
}

// Stop shuts peer i down; its data dir stays for a restart.
func (c *Cluster) Stop(i int) {
	c.mu.Lock()
	n := c.nodes[i]
	c.nodes[i] = nil
	c.mu.Unlock()
	if n != nil {
		n.Shutdown()
	}
}

// StopAll stops every peer.
func (c *Cluster) StopAll() {
	for i := range c.cfgs {
		c.Stop(i)
	}
}

// Leader returns the index of the peer that is leader, or -1.
func (c *Cluster) Leader() int {
	for i := range c.cfgs {
		if n := c.Node(i); n != nil && n.IsLeader() {
			return i
		}
	}
	return -1
}

// WaitForLeader waits for a leader among the running peers and returns its index.
func (c *Cluster) WaitForLeader() int {
	c.t.Helper()
	var leader int
	c.WaitFor("a leader", 10*time.Second, func() error {
		if leader = c.Leader(); leader < 0 {
			return fmt.Errorf("no leader")
		}
		return nil
	})
	return leader
}

// WaitFor polls cond until it returns nil or the deadline passes.
func (c *Cluster) WaitFor(what string, timeout time.Duration, cond func() error) {
	c.t.Helper()
	WaitFor(c.t, what, timeout, cond)
}

// WaitFor polls cond until it returns nil, failing the test with cond's last error after timeout.
func WaitFor(t testing.TB, what string, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// WaitForIdenticalStores waits until every peer's store snapshots to the same bytes: they have applied the
// same log and, Apply being deterministic, hold the same state.
func (c *Cluster) WaitForIdenticalStores(timeout time.Duration) {
	c.t.Helper()
	c.WaitFor("identical stores", timeout, func() error {
		var first []byte
		for i := range c.cfgs {
			n := c.Node(i)
			if n == nil {
				return fmt.Errorf("peer %d is stopped", i)
			}
			var buf bytes.Buffer
			n.Store().Snapshot().WriteTo(&buf)
			if i == 0 {
				first = buf.Bytes()
			} else if !bytes.Equal(first, buf.Bytes()) {
				return fmt.Errorf("peer %d differs from peer 0", i)
			}
		}
		return nil
	})
}

// Put writes key=value through peer i and returns the result.
func (c *Cluster) Put(i int, key, value string) (fsm.Result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n := c.Node(i)
	if n == nil {
		return fsm.Result{}, fmt.Errorf("peer %d is stopped", i)
	}
	res, err := n.Apply(ctx, &fsm.Command{Type: fsm.CmdTxn, Txn: &fsm.Txn{Success: []fsm.Op{{Type: fsm.OpPut, Key: key, Value: []byte(value)}}}})
	if err == nil {
		err = res.Err()
	}
	return res, err
}

// MustPut writes key=value through peer i, retrying while leadership changes hands, and fails the test if
// the write does not commit within 20 s. Only for writes that are safe to repeat: a write whose outcome was
// unknown may have committed, and is applied again. Tests whose cluster runs on one follower use it, since
// under -race on a loaded machine the 100 ms leader lease can lapse and the leader step down mid-loop.
func (c *Cluster) MustPut(i int, key, value string) {
	c.t.Helper()
	c.WaitFor("write of "+key, 20*time.Second, func() error {
		_, err := c.Put(i, key, value)
		if err != nil && !errors.Is(err, raftnode.ErrUnknownOutcome) && !errors.Is(err, raftnode.ErrNotLeader) &&
			!errors.Is(err, raftnode.ErrNoLeader) {
			c.t.Fatalf("write of %s through peer %d: %v", key, i, err)
		}
		return err
	})
}

// Network is a loopback network whose links can be cut, one way or both, or made to hang. Each peer dials
// through its own Layer.
type Network struct {
	mu      sync.Mutex
	blocked map[[2]string]bool          // {from, to} listen addresses
	holds   map[[2]string]chan struct{} // {from, to}: dials wait until the channel closes
	held    map[[2]string]int           // dials waiting on a hold
	conns   map[[2]string][]net.Conn    // open connections by {dialer, target}
}

// NewNetwork returns a fully connected network.
func NewNetwork() *Network {
	return &Network{
		blocked: map[[2]string]bool{}, holds: map[[2]string]chan struct{}{}, held: map[[2]string]int{},
		conns: map[[2]string][]net.Conn{},
	}
}

// Layer returns the connection layer of the peer listening on self.
func (nw *Network) Layer(self string) raftnode.Layer { return &netLayer{nw: nw, self: self} }

// Partition cuts every link between the two groups of peers (by listen address), both ways, and closes the
// connections already open across the cut.
func (nw *Network) Partition(a, b []string) {
	nw.Block(a, b)
	nw.Block(b, a)
}

// Block cuts the links from the peers of from to the peers of to, one way: their dials fail and the
// connections they opened close. Connections opened the other way stay up, so a peer of to still reaches a
// peer of from (and gets its answers on that connection).
func (nw *Network) Block(from, to []string) {
	nw.mu.Lock()
	var doomed []net.Conn
	for _, x := range from {
		for _, y := range to {
			k := [2]string{x, y}
			nw.blocked[k] = true
			doomed = append(doomed, nw.conns[k]...)
			delete(nw.conns, k)
		}
	}
	nw.mu.Unlock()
	for _, c := range doomed {
		c.Close()
	}
}

// Heal restores every link cut by Partition or Block (holds stay until Release).
func (nw *Network) Heal() {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	nw.blocked = map[[2]string]bool{}
}

// Hold makes the link from one peer to another hang, as when every packet is dropped: the connections the
// first opened to the second close, and its new dials wait until Release (or their own timeout).
func (nw *Network) Hold(from, to string) {
	k := [2]string{from, to}
	nw.mu.Lock()
	if nw.holds[k] == nil {
		nw.holds[k] = make(chan struct{})
	}
	doomed := nw.conns[k]
	delete(nw.conns, k)
	nw.mu.Unlock()
	for _, c := range doomed {
		c.Close()
	}
}

// HeldDials returns how many dials from one peer to another are waiting on a hold.
func (nw *Network) HeldDials(from, to string) int {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	return nw.held[[2]string{from, to}]
}

// Release ends a hold: the waiting dials go ahead.
func (nw *Network) Release(from, to string) {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	k := [2]string{from, to}
	if ch := nw.holds[k]; ch != nil {
		close(ch)
		delete(nw.holds, k)
	}
}

// ReleaseAll ends every hold.
func (nw *Network) ReleaseAll() {
	nw.mu.Lock()
	defer nw.mu.Unlock()
	for k, ch := range nw.holds {
		close(ch)
		delete(nw.holds, k)
	}
}

type netLayer struct {
	nw   *Network
	self string
}

func (l *netLayer) Listen(addr string) (net.Listener, error) { return net.Listen("tcp", addr) }

func (l *netLayer) Dial(addr string, timeout time.Duration) (net.Conn, error) {
	k := [2]string{l.self, addr}
	l.nw.mu.Lock()
	blocked, hold := l.nw.blocked[k], l.nw.holds[k]
	if hold != nil {
		l.nw.held[k]++
	}
	l.nw.mu.Unlock()
	if hold != nil {
		t := time.NewTimer(timeout)
		select {
		case <-hold:
		case <-t.C:
		}
		t.Stop()
		l.nw.mu.Lock()
		l.nw.held[k]--
		blocked = blocked || l.nw.blocked[k] || l.nw.holds[k] != nil
		l.nw.mu.Unlock()
	}
	if blocked {
		return nil, fmt.Errorf("dial %s: network partitioned", addr)
	}
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	l.nw.mu.Lock()
	defer l.nw.mu.Unlock()
	if l.nw.blocked[k] || l.nw.holds[k] != nil {
		conn.Close()
		return nil, fmt.Errorf("dial %s: network partitioned", addr)
	}
	l.nw.conns[k] = append(l.nw.conns[k], conn)
	return conn, nil
}
