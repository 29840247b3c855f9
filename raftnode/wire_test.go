package raftnode

import (
	"context"
	"errors"
	"io"
	"net"
	"net/rpc"
	"testing"
	"time"
)

// TestFromWire: the sentinel errors come back from a forwarded call as themselves, also with the leader's
// detail after them, so that a follower never takes a write of unknown outcome for one it may send again.
func TestFromWire(t *testing.T) {
	cases := []struct {
		wire    string
		want    error
		notWant error
	}{
		{ErrNotLeader.Error(), ErrNotLeader, ErrUnknownOutcome},
		{ErrUnknownOutcome.Error(), ErrUnknownOutcome, ErrNotLeader},
		{ErrUnknownOutcome.Error() + " (raft: leadership lost while committing log)", ErrUnknownOutcome, ErrShutdown},
		{ErrUnknownOutcome.Error() + " (this server shut down while the write was in flight)", ErrUnknownOutcome, ErrShutdown},
		{ErrNotLeader.Error() + "x", nil, ErrNotLeader}, // a prefix only counts when the detail is set apart
	}
	for _, c := range cases {
		err := fromWire(rpc.ServerError(c.wire))
		if c.want != nil && !errors.Is(err, c.want) {
			t.Errorf("%q: %v is not %v", c.wire, err, c.want)
		}
		if errors.Is(err, c.notWant) {
			t.Errorf("%q: %v is %v", c.wire, err, c.notWant)
		}
	}
}

// slowService answers Status after a pause, with a reply a test can recognise.
type slowService struct{ pause time.Duration }

func (s *slowService) Status(_ StatusArgs, reply *StatusReply) error {
	time.Sleep(s.pause)
	reply.ID = "late"
	return nil
}

// pipeLayer dials a net/rpc server served on the other end of an in-memory pipe, past the protocol byte.
type pipeLayer struct{ server *rpc.Server }

func (pipeLayer) Listen(string) (net.Listener, error) { return nil, errors.New("not listening") }
func (l pipeLayer) Dial(string, time.Duration) (net.Conn, error) {
	client, server := net.Pipe()
	go func() {
		var proto [1]byte
		if _, err := io.ReadFull(server, proto[:]); err == nil {
			l.server.ServeConn(server)
		}
	}()
	return client, nil
}

// TestCallGivenUpIgnoresItsLateAnswer: a call that ends at its context's deadline leaves the caller's reply
// alone when the answer arrives afterwards (net/rpc decoding into the caller's reply then raced with the
// caller reading it: autopilot's Status, under -race).
func TestCallGivenUpIgnoresItsLateAnswer(t *testing.T) {
	server := rpc.NewServer()
	if err := server.RegisterName("Raft", &slowService{pause: 200 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	pool := &rpcPool{layer: pipeLayer{server}, timeout: time.Second, clients: map[string]*rpc.Client{}}
	defer pool.closeAll()

	var reply StatusReply
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := pool.call(ctx, "peer", "Raft.Status", StatusArgs{}, &reply); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("call: %v; want the deadline", err)
	}
	// The caller owns reply again: it reads it while the answer arrives.
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if reply.ID != "" {
			t.Fatalf("the late answer %q was written into the reply of a call given up", reply.ID)
		}
		time.Sleep(time.Millisecond)
	}

	// A call that ends in time fills the reply.
	if err := pool.call(context.Background(), "peer", "Raft.Status", StatusArgs{}, &reply); err != nil || reply.ID != "late" {
		t.Fatalf("call in time: %v, reply %+v", err, reply)
	}
}
