package raftnode

import (
	"errors"
	"net/rpc"
	"testing"
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
