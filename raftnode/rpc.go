package raftnode

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/rpc"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/skiff-dev/skiff/fsm"
)

// The internal RPC between peers rides on the Raft port (see mux). It carries forwarded writes, read-index
// requests and status queries. net/rpc multiplexes concurrent calls over one connection per peer.

// ApplyArgs is a write: an encoded fsm.Command. Peers forward with Forward false, so the receiver must be the
// leader and a request can never bounce between peers; external clients set Forward to let the receiver
// forward it in turn.
type ApplyArgs struct {
	Command []byte
	Forward bool
}

// ApplyReply carries the encoded fsm.Result.
type ApplyReply struct{ Result []byte }

// ReadIndexArgs asks the leader for a read index.
type ReadIndexArgs struct{}

// ReadIndexReply is the leader's commit index, confirmed by a quorum.
type ReadIndexReply struct{ Index uint64 }

// StatusArgs asks a peer what it knows.
type StatusArgs struct{}

// StatusReply is a peer's view of the cluster.
type StatusReply struct {
	ID       string
	LeaderID string
	Servers  []string // IDs in the peer's latest configuration
	HasState bool
	// LastIndex is the index of the peer's last Raft log entry (or snapshot); zero from peers that predate it.
	LastIndex uint64
	// AppliedIndex is the last index the peer's state machine applied.
	AppliedIndex uint64
	// SinceLeaderContact is how long ago a follower last heard from the leader; zero on the leader, and -1
	// when the follower never has.
	SinceLeaderContact time.Duration
}

// SnapshotPastArgs asks the leader for a snapshot whose last index is past Index: a follower whose log
// conflicts with the snapshot it installed needs one (hashicorp/raft#697; see logStore).
type SnapshotPastArgs struct{ Index uint64 }

// SnapshotPastReply is the last index of the leader's newest snapshot.
type SnapshotPastReply struct{ Index uint64 }

// rpcService is the receiver registered with net/rpc. Method signatures follow net/rpc's rules.
type rpcService struct{ n *Node }

// Apply proposes a forwarded write on this peer, which must be the leader.
func (s *rpcService) Apply(args ApplyArgs, reply *ApplyReply) error {
	if !s.n.raftUp.Load() {
		return ErrNotLeader // still starting: the caller tries the leader again
	}
	cmd, err := fsm.DecodeCommand(args.Command)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.n.cfg.ApplyTimeout)
	defer cancel()
	apply := s.n.applyLocal
	if args.Forward {
		apply = func(ctx context.Context, _ []byte) (fsm.Result, error) { return s.n.Apply(ctx, cmd) }
	}
	res, err := apply(ctx, cmd.Encode())
	if err != nil {
		return err
	}
	reply.Result = fsm.EncodeResult(res)
	return nil
}

// ReadIndex returns the commit index after confirming leadership with a quorum.
func (s *rpcService) ReadIndex(args ReadIndexArgs, reply *ReadIndexReply) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.n.cfg.ApplyTimeout)
	defer cancel()
	if !s.n.raftUp.Load() {
		return ErrNotLeader
	}
	idx, err := s.n.leaderReadIndex(ctx)
	reply.Index = idx
	if errors.Is(err, ErrShutdown) {
		// This peer is going away, not the cluster: the asking follower retries with the next leader.
		err = ErrNotLeader
	}
	return err
}

// Status reports this peer's view.
func (s *rpcService) Status(args StatusArgs, reply *StatusReply) error {
	if !s.n.raftUp.Load() {
		return ErrNoLeader
	}
	*reply = s.n.status()
	return nil
}

// SnapshotPast makes sure the leader's newest snapshot ends past args.Index.
func (s *rpcService) SnapshotPast(args SnapshotPastArgs, reply *SnapshotPastReply) error {
	if !s.n.raftUp.Load() || s.n.refuseSnapshotPast.Load() {
		return ErrNotLeader
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.n.cfg.ApplyTimeout)
	defer cancel()
	idx, err := s.n.snapshotPast(ctx, args.Index)
	reply.Index = idx
	return err
}

// Errors cross the RPC as strings; these are mapped back to their sentinel values so callers can use
// errors.Is on a forwarded result.
var wireErrors = []error{ErrNotLeader, ErrNoLeader, ErrUnknownOutcome, ErrShutdown}

func fromWire(err error) error {
	var se rpc.ServerError
	if !errors.As(err, &se) {
		return err
	}
	for _, known := range wireErrors {
		switch {
		case string(se) == known.Error():
			return known
		case strings.HasPrefix(string(se), known.Error()+" "):
			// A sentinel with the leader's detail, such as an unknown outcome and its cause.
			return fmt.Errorf("%w (leader:%s)", known, strings.TrimPrefix(string(se), known.Error()))
		}
	}
	return fmt.Errorf("leader: %s", string(se))
}

// rpcPool keeps one net/rpc client per peer address.
type rpcPool struct {
	layer   Layer
	timeout time.Duration
	mu      sync.Mutex
	clients map[string]*rpc.Client
}

func (p *rpcPool) get(addr string) (*rpc.Client, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.clients[addr]; ok {
		return c, nil
	}
	conn, err := dialProto(p.layer, addr, protoRPC, p.timeout)
	if err != nil {
		return nil, &dialError{err}
	}
	c := rpc.NewClient(conn)
	p.clients[addr] = c
	return c, nil
}

func (p *rpcPool) drop(addr string, c *rpc.Client) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.clients[addr] == c {
		delete(p.clients, addr)
		c.Close()
	}
}

func (p *rpcPool) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for addr, c := range p.clients {
		c.Close()
		delete(p.clients, addr)
	}
}

// dialError marks a call that never left this peer, which is always safe to retry.
type dialError struct{ err error }

func (e *dialError) Error() string { return "dial: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// call runs one RPC with ctx's deadline. A broken connection is dropped from the pool.
// A call that finds its pooled connection already shut down was never sent, so it is retried once on a
// fresh connection rather than failed.
//
// net/rpc decodes the answer into a value of its own, copied to reply only when the call ends here: a call
// given up at ctx's deadline may still be answered, and net/rpc would then write into reply while the
// caller reads it.
func (p *rpcPool) call(ctx context.Context, addr, method string, args, reply any) error {
	for attempt := 0; ; attempt++ {
		c, err := p.get(addr)
		if err != nil {
			return err
		}
		answer := reflect.New(reflect.TypeOf(reply).Elem())
		call := c.Go(method, args, answer.Interface(), make(chan *rpc.Call, 1))
		// net/rpc ends a call with ErrShutdown both when it refuses to send it (at once, inside Go) and when
		// the connection closes while the call waits for its answer: only the first is safe to send again.
		endedInGo := false
		select {
		case <-call.Done:
			endedInGo = true
		default:
			select {
			case <-call.Done:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if call.Error == rpc.ErrShutdown || isConnError(call.Error) {
			p.drop(addr, c)
		}
		if endedInGo && call.Error == rpc.ErrShutdown && attempt == 0 {
			continue
		}
		if call.Error == nil {
			reflect.ValueOf(reply).Elem().Set(answer.Elem())
		}
		return fromWire(call.Error)
	}
}

func isConnError(err error) bool {
	var ne net.Error
	return err != nil && (errors.As(err, &ne) || errors.Is(err, net.ErrClosed) || err.Error() == "unexpected EOF" || err.Error() == "EOF")
}

// Client sends writes to one peer over the internal RPC, the way a peer forwards them. Tools (benchmarks,
// tests) use it to write through a chosen peer of a running cluster.
type Client struct {
	addr string
	pool *rpcPool
}

// NewClient returns a client for the peer whose Raft address is addr.
func NewClient(addr string, layer Layer) *Client {
	if layer == nil {
		layer = TCPLayer{}
	}
	return &Client{addr: addr, pool: &rpcPool{layer: layer, timeout: 5 * time.Second, clients: map[string]*rpc.Client{}}}
}

// Apply commits cmd through the peer, which forwards it to the leader if needed.
func (c *Client) Apply(ctx context.Context, cmd *fsm.Command) (fsm.Result, error) {
	if cmd.Time == 0 {
		cmd.Time = time.Now().UnixNano()
	}
	var reply ApplyReply
	if err := c.pool.call(ctx, c.addr, "Skiff.Apply", ApplyArgs{Command: cmd.Encode(), Forward: true}, &reply); err != nil {
		return fsm.Result{}, err
	}
	return fsm.DecodeResult(reply.Result)
}

// Close drops the connection.
func (c *Client) Close() { c.pool.closeAll() }
