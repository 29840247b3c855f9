package apiserver

import (
	"context"
	"sync"
	"time"

	"github.com/skiff-dev/skiff/fsm"
)

// memBackend is a Raft backend for tests: an in-memory store, each write applied at the next index.
type memBackend struct {
	mu    sync.Mutex
	store *fsm.Store
	index uint64
}

// NewMemBackend returns a backend whose store has had one write: a store at revision 0 refuses lists, and
// the admission plugins' informers (webhook configurations, policies) must list before the API admits any
// write. A server's store never is at revision 0.
func NewMemBackend() *memBackend {
	m := &memBackend{store: fsm.New(fsm.Options{})}
	m.Apply(context.Background(), &fsm.Command{Type: fsm.CmdTxn, Txn: &fsm.Txn{Success: []fsm.Op{{Type: fsm.OpPut, Key: "/seed", Value: []byte("x")}}}})
	return m
}

func (m *memBackend) Apply(_ context.Context, cmd *fsm.Command) (fsm.Result, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.index++
	if cmd.Time == 0 {
		cmd.Time = time.Now().UnixNano()
	}
	return m.store.Apply(m.index, cmd.Encode()), nil
}

func (m *memBackend) LinearizableRead(context.Context) error { return nil }
func (m *memBackend) Store() *fsm.Store                      { return m.store }
