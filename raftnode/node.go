package raftnode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/rpc"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"go.etcd.io/bbolt"

	"github.com/skiff-dev/skiff/fsm"
)

// Errors of the write and read paths. The API maps ErrNoLeader to 503 with Retry-After.
var (
	ErrNoLeader       = errors.New("raftnode: no leader elected within the wait")
	ErrNotLeader      = errors.New("raftnode: not leader")
	ErrUnknownOutcome = errors.New("raftnode: leadership lost before the write was known to commit; its outcome is unknown")
	ErrShutdown       = errors.New("raftnode: shut down")
)

// Config configures one peer.
type Config struct {
	ID            string // unique server ID; Skiff uses the server name
	DataDir       string // Raft state lives in DataDir/raft
	BindAddr      string // host:port the Raft and RPC listener binds
	AdvertiseAddr string // host:port peers dial; defaults to the bound address

	HeartbeatTimeout   time.Duration
	ElectionTimeout    time.Duration
	LeaderLeaseTimeout time.Duration
	CommitTimeout      time.Duration
	SnapshotThreshold  uint64
	SnapshotInterval   time.Duration
	TrailingLogs       uint64
	// ApplyTimeout bounds how long a write or read waits for a leader before failing with ErrNoLeader.
	ApplyTimeout time.Duration
	// TTLInterval is how often the leader looks for expired keys.
	TTLInterval time.Duration

	Store  fsm.Options
	Layer  Layer
	Logger hclog.Logger
}

// DefaultConfig returns the production defaults. They are chosen so that a failover completes well under two
// seconds on a healthy network.
func DefaultConfig() Config {
	return Config{
		HeartbeatTimeout:   500 * time.Millisecond,
		ElectionTimeout:    500 * time.Millisecond,
		LeaderLeaseTimeout: 250 * time.Millisecond,
		CommitTimeout:      50 * time.Millisecond,
		SnapshotThreshold:  8192,
		SnapshotInterval:   30 * time.Second,
		TrailingLogs:       10240,
		ApplyTimeout:       10 * time.Second,
		TTLInterval:        time.Second,
	}
}

func (c *Config) fill() {
	d := DefaultConfig()
	for _, f := range []struct{ v, def *time.Duration }{
		{&c.HeartbeatTimeout, &d.HeartbeatTimeout}, {&c.ElectionTimeout, &d.ElectionTimeout},
		{&c.LeaderLeaseTimeout, &d.LeaderLeaseTimeout}, {&c.CommitTimeout, &d.CommitTimeout},
		{&c.SnapshotInterval, &d.SnapshotInterval}, {&c.ApplyTimeout, &d.ApplyTimeout}, {&c.TTLInterval, &d.TTLInterval},
	} {
		if *f.v <= 0 {
			*f.v = *f.def
		}
	}
	if c.SnapshotThreshold == 0 {
		c.SnapshotThreshold = d.SnapshotThreshold
	}
	if c.TrailingLogs == 0 {
		c.TrailingLogs = d.TrailingLogs
	}
	if c.Layer == nil {
		c.Layer = TCPLayer{}
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
}

// Node is one Raft peer with its store.
type Node struct {
	cfg    Config
	logger hclog.Logger
	store  *fsm.Store
	raft   *raft.Raft
	logs   *raftboltdb.BoltStore
	snaps  *raft.FileSnapshotStore
	trans  *raft.NetworkTransport
	mux    *mux
	rpcSrv *rpc.Server
	pool   *rpcPool
	addr   net.Addr

	notifyCh chan bool
	leaderMu sync.Mutex
	// term is this peer's current term of leadership, nil when it does not lead; lastTerm is the most recent
	// one, which may still be stopping its services.
	term, lastTerm *leaderTerm
	services       []leaderService
	leadWG         sync.WaitGroup // one per term, until its services have returned

	// Linearizable reads on the leader share leadership checks: a read joins the next round, which starts
	// after it arrived, and one round at a time runs (see confirmLeadership).
	verifyMu     sync.Mutex
	nextRound    *verifyRound
	verifying    bool
	verifyRounds atomic.Int64
	// raftUp is set once n.raft exists; RPC handlers, served from before, check it (it also orders their
	// reads of n.raft after its assignment).
	raftUp atomic.Bool

	// Workarounds for open hashicorp/raft issues (upstream.go).
	transferRefusedSince atomic.Int64  // #696: unix nanos of the first write refused in the current run, or 0
	handingOff           atomic.Bool   // #696: a hand-off of stuck leadership is under way
	askingSnapshot       atomic.Bool   // #697: a request for a snapshot past our log is under way
	conflictWarned       atomic.Uint64 // #697: the snapshot index last warned about
	snapshotPastMu       sync.Mutex    // #697: one snapshotPast at a time on the leader
	refuseSnapshotPast   atomic.Bool   // #697, tests only: the SnapshotPast RPC fails, as from a deposed leader

	// Writes in flight when this peer lost its leadership, waiting to learn whether they committed (outcome.go).
	outcomes outcomeWaiters
	// commitNotice asks the leader to let followers know of a commit now (commitnotice.go).
	commitNotice chan struct{}
	// lastIndexAtAck is the end of the log when this peer, as leader, last acknowledged a write.
	lastIndexAtAck atomic.Uint64

	removed     chan struct{}
	removedOnce sync.Once
	shutdown    chan struct{}
	shutOnce    sync.Once
	bgWG        sync.WaitGroup
	metrics     *metrics
	everMember  atomic.Bool
}

type leaderService struct {
	name string
	run  func(ctx context.Context)
}

// New opens (or creates) the peer's state and starts Raft. It does not bootstrap: see Bootstrap.
func New(cfg Config) (*Node, error) {
	cfg.fill()
	if cfg.ID == "" || cfg.DataDir == "" || cfg.BindAddr == "" {
		return nil, errors.New("raftnode: ID, DataDir and BindAddr are required")
	}
	n := &Node{
		cfg: cfg, logger: cfg.Logger.Named("raft"), store: fsm.New(cfg.Store),
		notifyCh: make(chan bool, 16),
		removed:  make(chan struct{}), shutdown: make(chan struct{}), metrics: newMetrics(),
		commitNotice: make(chan struct{}, 1),
	}
	if err := n.open(); err != nil {
		n.closeResources()
		return nil, err
	}
	n.bgWG.Add(3)
	go n.leadershipLoop()
	go n.membershipLoop()
	go n.snapshotConflictLoop()
	n.OnLeadership("ttl-reaper", n.reapExpired)
	n.OnLeadership("commit-notice", n.announceCommits)
	return n, nil
}

func (n *Node) open() error {
	dir := filepath.Join(n.cfg.DataDir, "raft")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	var err error
	// raft-boltdb syncs every write (NoSync stays false): an acknowledged write survives a crash. The free-page
	// list is kept as etcd keeps its backend's: in a map, and not written to the file (bbolt rebuilds it when
	// it opens the file). The array kind, written at every commit, cost the leader hundreds of megabytes of
	// merged copies under a steady write load.
	bolt := &bbolt.Options{NoFreelistSync: true, FreelistType: bbolt.FreelistMapType}
	if n.logs, err = raftboltdb.New(raftboltdb.Options{Path: filepath.Join(dir, "raft.db"), BoltOptions: bolt}); err != nil {
		return fmt.Errorf("opening raft log store: %w", err)
	}
	if n.snaps, err = raft.NewFileSnapshotStoreWithLogger(dir, 2, n.logger.Named("snapshots")); err != nil {
		return fmt.Errorf("opening snapshot store: %w", err)
	}
	ln, err := n.cfg.Layer.Listen(n.cfg.BindAddr)
	if err != nil {
		return fmt.Errorf("listening for raft on %s: %w", n.cfg.BindAddr, err)
	}
	if n.addr, err = resolveAdvertise(n.cfg.AdvertiseAddr, ln); err != nil {
		ln.Close()
		return err
	}
	n.mux = newMux(ln, n.logger)
	stream := &subListener{m: n.mux, ch: n.mux.raft, addr: n.addr, proto: protoRaft, layer: n.cfg.Layer}
	n.trans = raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{
		Stream: stream, MaxPool: 4, Timeout: 10 * time.Second, Logger: n.logger.Named("transport"),
	})
	n.pool = &rpcPool{layer: n.cfg.Layer, timeout: 5 * time.Second, clients: map[string]*rpc.Client{}}
	n.rpcSrv = rpc.NewServer()
	if err := n.rpcSrv.RegisterName("Skiff", &rpcService{n}); err != nil {
		return err
	}
	// RPC is served at once, and its handlers answer ErrNotLeader until raft exists (see raftUp): a
	// forwarded write reaching a starting peer then goes elsewhere instead of waiting out a log replay.
	go n.serveRPC(&subListener{m: n.mux, ch: n.mux.rpc, addr: n.addr})

	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(n.cfg.ID)
	rc.Logger = n.logger
	rc.HeartbeatTimeout = n.cfg.HeartbeatTimeout
	rc.ElectionTimeout = n.cfg.ElectionTimeout
	rc.LeaderLeaseTimeout = n.cfg.LeaderLeaseTimeout
	rc.CommitTimeout = n.cfg.CommitTimeout
	rc.SnapshotThreshold = n.cfg.SnapshotThreshold
	rc.SnapshotInterval = n.cfg.SnapshotInterval
	rc.TrailingLogs = n.cfg.TrailingLogs
	rc.NotifyCh = n.notifyCh
	// Concurrent proposals are grouped into one disk write and one AppendEntries per round.
	rc.BatchApplyCh = true
	rc.MaxAppendEntries = 512
	rc.ShutdownOnRemove = true
	// The log store applies Rule 7 on snapshot installs, and the transport queues heartbeats to the main loop:
	// workarounds for hashicorp/raft#697 and #695 (upstream.go).
	cached, err := raft.NewLogCache(1024, logStore{BoltStore: n.logs, n: n})
	if err != nil {
		return err
	}
	n.raft, err = raft.NewRaft(rc, &raftFSM{n}, cached, n.logs, n.snaps, mainLoopTransport{n.trans})
	if err != nil {
		return fmt.Errorf("starting raft: %w", err)
	}
	n.raftUp.Store(true)
	return nil
}

// serveRPC serves internal RPC connections until the listener closes. (rpc.Server.Accept would log the
// closing as an error.)
func (n *Node) serveRPC(ln net.Listener) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		go n.rpcSrv.ServeConn(conn)
	}
}

func (n *Node) closeResources() {
	if n.pool != nil {
		n.pool.closeAll()
	}
	if n.trans != nil {
		n.trans.Close()
	} else if n.mux != nil {
		n.mux.Close()
	}
	if n.logs != nil {
		n.logs.Close()
	}
}

// Store returns the peer's store, for local (possibly stale) reads and watches.
func (n *Node) Store() *fsm.Store { return n.store }

// ID returns the server ID.
func (n *Node) ID() string { return n.cfg.ID }

// Addr returns the address peers dial.
func (n *Node) Addr() string { return n.addr.String() }

// HasState reports whether this peer has Raft state of its own (a log, a snapshot or a configuration). A peer
// with state never bootstraps.
func (n *Node) HasState() bool {
	ok, err := raft.HasExistingState(n.logs, n.logs, n.snaps)
	return err != nil || ok // when in doubt, never bootstrap
}

// Server names one voter of a bootstrap configuration.
type Server struct{ ID, Address string }

// Bootstrap writes the initial configuration. Every peer of the configuration may call it with the same
// servers; a peer that already has state refuses.
func (n *Node) Bootstrap(servers []Server) error {
	var cfg raft.Configuration
	for _, s := range servers {
		cfg.Servers = append(cfg.Servers, raft.Server{Suffrage: raft.Voter, ID: raft.ServerID(s.ID), Address: raft.ServerAddress(s.Address)})
	}
	return n.raft.BootstrapCluster(cfg).Error()
}

// IsLeader reports whether this peer is the leader.
func (n *Node) IsLeader() bool { return n.raft.State() == raft.Leader }

// State returns the Raft state name: Leader, Follower, Candidate or Shutdown.
func (n *Node) State() string { return n.raft.State().String() }

// Leader returns the current leader's ID and address, empty when unknown.
func (n *Node) Leader() (id, addr string) {
	a, i := n.raft.LeaderWithID()
	return string(i), string(a)
}

// Apply commits a command through Raft from any peer and returns the store's result. On a follower the
// command is forwarded to the leader. While there is no leader it waits up to ApplyTimeout (or ctx's
// deadline, if sooner) and then fails with ErrNoLeader.
func (n *Node) Apply(ctx context.Context, cmd *fsm.Command) (fsm.Result, error) {
	start := time.Now()
	if cmd.Time == 0 {
		cmd.Time = start.UnixNano()
	}
	data := cmd.Encode()
	ctx, cancel := context.WithTimeout(ctx, n.cfg.ApplyTimeout)
	defer cancel()
	for {
		var res fsm.Result
		var err error
		leaderID, leaderAddr := n.Leader()
		switch {
		case n.IsLeader():
			res, err = n.applyLocal(ctx, data)
		case leaderAddr != "" && leaderID != n.cfg.ID:
			res, err = n.forwardApply(ctx, leaderAddr, data)
		default:
			err = ErrNotLeader
		}
		if err == nil {
			n.metrics.observeApply(time.Since(start))
			return res, nil
		}
		if !retryable(err) {
			return res, err
		}
		if err := n.waitRetry(ctx); err != nil {
			return res, err
		}
	}
}

// retryable reports whether a write certainly did not commit, so proposing it again is safe.
func retryable(err error) bool {
	var de *dialError
	return errors.Is(err, ErrNotLeader) || errors.As(err, &de)
}

// waitRetry pauses briefly before the next attempt, or ends with ErrNoLeader when the wait is over.
func (n *Node) waitRetry(ctx context.Context) error {
	select {
	case <-time.After(10 * time.Millisecond):
		return nil
	case <-n.shutdown:
		return ErrShutdown
	case <-ctx.Done():
		return ErrNoLeader
	}
}

func (n *Node) applyLocal(ctx context.Context, data []byte) (fsm.Result, error) {
	timeout := n.cfg.ApplyTimeout
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	select {
	case <-n.shutdown:
		return fsm.Result{}, ErrShutdown // not proposed
	default:
	}
	f := n.raft.Apply(data, timeout)
	if err := n.await(ctx, f); err != nil {
		switch {
		case errors.Is(err, errAwaitAbandoned):
			return fsm.Result{}, fmt.Errorf("%w (%v)", ErrUnknownOutcome, ctx.Err())
		case errors.Is(err, raft.ErrLeadershipTransferInProgress):
			n.noteTransferRefusal() // hashicorp/raft#696
			return fsm.Result{}, ErrNotLeader
		case errors.Is(err, raft.ErrNotLeader):
			return fsm.Result{}, ErrNotLeader
		case errors.Is(err, raft.ErrRaftShutdown), errors.Is(err, ErrShutdown):
			// The entry may be in the log already (a future ends with ErrRaftShutdown whenever Raft shuts
			// down while it waits), so a retry could apply it twice.
			return fsm.Result{}, fmt.Errorf("%w (this server shut down while the write was in flight)", ErrUnknownOutcome)
		case errors.Is(err, raft.ErrEnqueueTimeout):
			return fsm.Result{}, ErrNoLeader
		case errors.Is(err, raft.ErrLeadershipLost):
			// The entry may or may not commit; a leader's commit index tells which.
			res, err := n.learnOutcome(ctx, f.Index(), data, err)
			if errors.Is(err, errNotCommitted) {
				return res, ErrNotLeader // proposed again to the next leader
			}
			return res, err
		default: // anything else: the entry may or may not commit.
			return fsm.Result{}, fmt.Errorf("%w (%v)", ErrUnknownOutcome, err)
		}
	}
	n.transferRefusedSince.Store(0)
	n.noteCommitted()
	res, ok := f.Response().(fsm.Result)
	if !ok {
		return fsm.Result{}, fmt.Errorf("raftnode: unexpected FSM response %T", f.Response())
	}
	return res, nil
}

func (n *Node) forwardApply(ctx context.Context, leaderAddr string, data []byte) (fsm.Result, error) {
	var reply ApplyReply
	if err := n.pool.call(ctx, leaderAddr, "Skiff.Apply", ApplyArgs{Command: data}, &reply); err != nil {
		var de *dialError
		switch {
		case errors.Is(err, ErrUnknownOutcome):
			return fsm.Result{}, err
		case errors.As(err, &de), errors.Is(err, ErrNotLeader), errors.Is(err, ErrNoLeader), errors.Is(err, ErrShutdown):
			return fsm.Result{}, ErrNotLeader // not proposed: safe to retry against the next leader
		case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
			return fsm.Result{}, fmt.Errorf("%w (%v)", ErrUnknownOutcome, err)
		case isConnError(err), err == rpc.ErrShutdown:
			return fsm.Result{}, fmt.Errorf("%w (connection to leader lost: %v)", ErrUnknownOutcome, err)
		}
		return fsm.Result{}, err
	}
	return fsm.DecodeResult(reply.Result)
}

// LinearizableRead returns once this peer's store reflects every write acknowledged before the call: the
// ReadIndex protocol. The leader confirms its leadership with a quorum and waits for its store to apply the
// commit index; a follower asks the leader for that index and waits for its own store to reach it.
func (n *Node) LinearizableRead(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, n.cfg.ApplyTimeout)
	defer cancel()
	for {
		var idx uint64
		var err error
		_, leaderAddr := n.Leader()
		switch {
		case n.IsLeader():
			idx, err = n.leaderReadIndex(ctx)
		case leaderAddr != "":
			var reply ReadIndexReply
			err = n.pool.call(ctx, leaderAddr, "Skiff.ReadIndex", ReadIndexArgs{}, &reply)
			if err == nil {
				// Only then: a call abandoned at ctx's end may still be decoding its late answer into reply.
				idx = reply.Index
			}
			var de *dialError
			switch {
			case errors.As(err, &de) || isConnError(err):
				err = ErrNotLeader
			case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
				err = ErrNoLeader // no answer in time: as when no leader is known
			}
		default:
			err = ErrNotLeader
		}
		if err == nil {
			if !n.store.WaitApplied(idx, ctx.Done()) {
				return ErrNoLeader
			}
			return nil
		}
		if !errors.Is(err, ErrNotLeader) && !errors.Is(err, ErrNoLeader) {
			return err
		}
		if err := n.waitRetry(ctx); err != nil {
			return err
		}
	}
}

// leaderReadIndex returns the commit index once leadership is confirmed and this term's no-op has applied
// (before that, the commit index may not cover the previous term's entries).
func (n *Node) leaderReadIndex(ctx context.Context) (uint64, error) {
	if !n.IsLeader() {
		return 0, ErrNotLeader // a stepped-down peer's ready channel would never close
	}
	n.leaderMu.Lock()
	term := n.term
	n.leaderMu.Unlock()
	if term == nil {
		return 0, ErrNotLeader // leadership not taken up yet, or ended
	}
	select {
	case <-term.ready:
	case <-term.ctx.Done():
		// Leadership ended before this term's no-op applied: its ready channel will never close.
		return 0, ErrNotLeader
	case <-ctx.Done():
		return 0, ErrNoLeader
	}
	idx := n.raft.CommitIndex()
	if err := n.confirmLeadership(ctx); err != nil {
		return 0, err
	}
	if !n.store.WaitApplied(idx, ctx.Done()) {
		return 0, ErrNoLeader
	}
	return idx, nil
}

// verifyRound is one leadership check that the reads waiting on it share.
type verifyRound struct {
	done chan struct{}
	err  error
}

// confirmLeadership returns once this peer has confirmed with a quorum, after the call began, that it is
// still the leader (ErrNotLeader if it is not). Concurrent callers share one raft VerifyLeader: a caller joins
// the next round, which starts only after the running one ends, so the check it gets began after it
// arrived, which is what the ReadIndex protocol needs. Besides saving a heartbeat round per read, this keeps
// at most one verification pending inside hashicorp/raft, whose heartbeat goroutines block answering
// verifications once its queue of them (64) is full and the leader has stepped down, which then hangs
// raft's Shutdown.
func (n *Node) confirmLeadership(ctx context.Context) error {
	n.verifyMu.Lock()
	round := n.nextRound
	if round == nil {
		round = &verifyRound{done: make(chan struct{})}
		n.nextRound = round
	}
	if !n.verifying {
		n.verifying = true
		go n.runVerifyRounds()
	}
	n.verifyMu.Unlock()
	select {
	case <-round.done:
		return round.err
	case <-ctx.Done():
		return ErrNoLeader
	case <-n.shutdown:
		return ErrShutdown
	}
}

// LeadershipChecks is how many leadership verifications linearizable reads on this peer have started.
func (n *Node) LeadershipChecks() int64 { return n.verifyRounds.Load() }

// runVerifyRounds runs the waiting rounds one after the other until none is left.
func (n *Node) runVerifyRounds() {
	for {
		n.verifyMu.Lock()
		round := n.nextRound
		n.nextRound = nil
		if round == nil {
			n.verifying = false
			n.verifyMu.Unlock()
			return
		}
		n.verifyMu.Unlock()
		select {
		case <-n.shutdown:
			round.err = ErrShutdown
			close(round.done)
			continue
		default:
		}
		n.verifyRounds.Add(1)
		ctx, cancel := context.WithTimeout(context.Background(), n.cfg.ApplyTimeout)
		if err := n.await(ctx, n.raft.VerifyLeader()); err != nil {
			round.err = ErrNotLeader
			if errors.Is(err, ErrShutdown) || errors.Is(err, raft.ErrRaftShutdown) {
				round.err = ErrShutdown
			}
		}
		cancel()
		close(round.done)
	}
}

// errAwaitAbandoned means await stopped waiting before the future resolved.
var errAwaitAbandoned = errors.New("raftnode: stopped waiting for raft")

// await waits for a Raft future, but no longer than ctx and this node's life. A future can stay unresolved
// forever: with BatchApplyCh, one still buffered when Raft shuts down is never answered.
func (n *Node) await(ctx context.Context, f raft.Future) error {
	done := make(chan error, 1)
	go func() { done <- f.Error() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return errAwaitAbandoned
	case <-n.shutdown:
		return ErrShutdown
	}
}

// OnLeadership registers a service that runs while this peer is leader. It starts after the new leader's
// barrier (a no-op of its own term, applied) and its context is cancelled when leadership is lost.
func (n *Node) OnLeadership(name string, run func(ctx context.Context)) {
	n.leaderMu.Lock()
	defer n.leaderMu.Unlock()
	n.services = append(n.services, leaderService{name: name, run: run})
}

func (n *Node) leadershipLoop() {
	defer n.bgWG.Done()
	for {
		select {
		case <-n.shutdown:
			n.stopLeading()
			n.leadWG.Wait() // the stores close next: every term's services must have returned
			return
		case isLeader := <-n.notifyCh:
			n.transferRefusedSince.Store(0) // refusals of an earlier term tell nothing about this one
			if isLeader {
				n.startLeading()
			} else {
				n.stopLeading()
			}
		}
	}
}

// leaderTerm is one term of this peer's leadership.
type leaderTerm struct {
	ctx    context.Context // cancelled when the term ends
	cancel context.CancelFunc
	ready  chan struct{} // closed once a no-op of this term has applied: reads may be served
	done   chan struct{} // closed once the term has ended and its services have returned

	mu      sync.Mutex
	running map[string]bool // services not returned yet, by name
}

// stillRunning names the term's services that have not returned, sorted.
func (t *leaderTerm) stillRunning() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var names []string
	for name := range t.running {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// startLeading begins a term: the barrier, then reads, then the leader services. It does not wait for the
// services of the previous term to stop (a controller may take long to finish a call): this term's reads
// are served as soon as its barrier applies, and only its services wait, so that two generations of them
// never act at once.
func (n *Node) startLeading() {
	n.stopLeading()
	ctx, cancel := context.WithCancel(context.Background())
	term := &leaderTerm{ctx: ctx, cancel: cancel, ready: make(chan struct{}), done: make(chan struct{}),
		running: map[string]bool{}}
	n.leaderMu.Lock()
	previous := n.lastTerm
	n.term, n.lastTerm = term, term
	n.leaderMu.Unlock()
	n.leadWG.Add(1)
	go func() {
		defer n.leadWG.Done()
		var services sync.WaitGroup
		defer func() {
			services.Wait()
			// Done only once every earlier term is: a term that ended while it waited for its predecessor
			// started nothing, and the next one must still wait for the predecessor's services.
			if previous != nil {
				<-previous.done
			}
			close(term.done)
		}()
		// The barrier: a no-op proposed and applied in this term. When it has applied, so has every entry of
		// earlier terms, and the store's revision has moved to this term.
		for {
			if n.raft.State() != raft.Leader || ctx.Err() != nil {
				return
			}
			res, err := n.applyLocal(ctx, (&fsm.Command{Type: fsm.CmdNoop, Time: time.Now().UnixNano()}).Encode())
			if err == nil {
				n.logger.Info("leadership established", "revision", res.Revision)
				break
			}
			n.logger.Warn("leader barrier failed, retrying", "error", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
		close(term.ready)
		if previous != nil {
			select {
			case <-previous.done:
			default:
				waited := time.Now()
				n.logger.Warn("leader services wait for those of the previous term to stop", "running", previous.stillRunning())
				select {
				case <-previous.done:
					n.logger.Info("previous term's leader services stopped", "waited", time.Since(waited))
				case <-ctx.Done():
					return
				}
			}
		}
		n.leaderMu.Lock()
		list := append([]leaderService(nil), n.services...)
		n.leaderMu.Unlock()
		for _, s := range list {
			term.mu.Lock()
			term.running[s.name] = true
			term.mu.Unlock()
			services.Go(func() {
				defer func() {
					term.mu.Lock()
					delete(term.running, s.name)
					term.mu.Unlock()
				}()
				n.logger.Debug("leader service starting", "service", s.name)
				s.run(ctx)
			})
		}
	}()
}

// stopLeading ends the current term, if any; its services stop in the background.
func (n *Node) stopLeading() {
	n.leaderMu.Lock()
	term := n.term
	n.term = nil
	n.leaderMu.Unlock()
	if term != nil {
		term.cancel()
	}
}

// reapExpired is a leader service: it proposes deletes for expired keys. Each delete carries the key's mod
// revision, so a key refreshed in the meantime survives.
func (n *Node) reapExpired(ctx context.Context) {
	t := time.NewTicker(n.cfg.TTLInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, kv := range n.store.Expired(time.Now().UnixNano(), 512) {
			_, err := n.Apply(ctx, &fsm.Command{Type: fsm.CmdDelete, Key: kv.Key, ExpectedModRevision: kv.ModRevision})
			if err != nil && ctx.Err() == nil {
				n.logger.Warn("expiring key failed", "key", kv.Key, "error", err)
			}
		}
	}
}

// Removed is closed when this peer learns it was removed from the cluster. The process should then shut
// down rather than start elections forever.
func (n *Node) Removed() <-chan struct{} { return n.removed }

// Shutdown stops Raft and closes the stores. It is safe to call more than once.
func (n *Node) Shutdown() error {
	var err error
	n.shutOnce.Do(func() {
		close(n.shutdown)
		n.bgWG.Wait()
		err = n.raft.Shutdown().Error()
		n.closeResources()
	})
	return err
}

// raftFSM adapts the store to raft.BatchingFSM.
type raftFSM struct{ n *Node }

func (f *raftFSM) Apply(l *raft.Log) interface{} { return f.ApplyBatch([]*raft.Log{l})[0] }

func (f *raftFSM) ApplyBatch(logs []*raft.Log) []interface{} {
	start := time.Now()
	out := make([]interface{}, len(logs))
	entries := make([]fsm.Entry, 0, len(logs))
	for _, l := range logs {
		e := fsm.Entry{Index: l.Index}
		if l.Type == raft.LogCommand {
			e.Data = l.Data
		}
		entries = append(entries, e)
	}
	results := f.n.store.ApplyBatch(entries)
	for i, res := range results {
		if logs[i].Type == raft.LogCommand {
			out[i] = res
		}
	}
	f.n.outcomes.deliver(entries, results)
	f.n.metrics.observeFSMBatch(time.Since(start), len(entries))
	return out
}

func (f *raftFSM) Snapshot() (raft.FSMSnapshot, error) {
	return &raftSnapshot{f.n.store.Snapshot()}, nil
}

func (f *raftFSM) Restore(r io.ReadCloser) error {
	defer r.Close()
	return f.n.store.Restore(r)
}

type raftSnapshot struct{ s *fsm.Snapshot }

func (s *raftSnapshot) Persist(sink raft.SnapshotSink) error {
	if _, err := s.s.WriteTo(sink); err != nil {
		sink.Cancel()
		return err
	}
	return sink.Close()
}

func (s *raftSnapshot) Release() {}

// Stats returns a few numbers about the peer, for tests and diagnostics.
func (n *Node) Stats() map[string]uint64 {
	first, _ := n.logs.FirstIndex()
	term, _ := strconv.ParseUint(n.raft.Stats()["term"], 10, 64)
	return map[string]uint64{
		"term":              term,
		"first_log_index":   first,
		"last_log_index":    n.raft.LastIndex(),
		"commit_index":      n.raft.CommitIndex(),
		"applied_index":     n.store.AppliedIndex(),
		"snapshot_installs": n.store.Restores(),
	}
}
