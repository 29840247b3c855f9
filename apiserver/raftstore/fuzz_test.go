package raftstore

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/apitesting"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/apis/example"
	examplev1 "k8s.io/apiserver/pkg/apis/example/v1"
	"k8s.io/apiserver/pkg/storage"

	"github.com/skiff-dev/skiff/fsm"
)

// memBackend applies commands straight to a store, in order, as a one-peer Raft would: fast enough to fuzz.
type memBackend struct {
	mu    sync.Mutex
	store *fsm.Store
	index uint64
}

func (m *memBackend) Apply(ctx context.Context, cmd *fsm.Command) (fsm.Result, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.index++
	if cmd.Time == 0 {
		cmd.Time = int64(m.index)
	}
	return m.store.Apply(m.index, cmd.Encode()), nil
}

func (m *memBackend) LinearizableRead(context.Context) error { return nil }
func (m *memBackend) Store() *fsm.Store                      { return m.store }

// FuzzStorage drives the storage layer with operations decoded from the input, including raw garbage
// written under object keys, malformed resourceVersions and continue tokens. Nothing may panic, and errors
// must be errors. `go test -fuzz FuzzStorage ./apiserver/raftstore/` explores beyond the seeds.
func FuzzStorage(f *testing.F) {
	f.Add([]byte{0, 1, 0, 2, 1, 1, 2, 1, 3, 0, 4, 0})
	f.Add([]byte{5, 1, 0xff, 0x00, 0x13, 1, 1, 3, 1})
	f.Add([]byte("6abc7xyz8\x00\x01\x02"))
	f.Fuzz(func(t *testing.T, data []byte) {
		backend := &memBackend{store: fsm.New(fsm.Options{HistoryEvents: 16})}
		s := New(Config{
			Backend: backend, Codec: apitesting.TestCodec(codecs, examplev1.SchemeGroupVersion),
			Prefix: "/registry", ResourcePrefix: "/pods/", GroupResource: schema.GroupResource{Resource: "pods"},
			NewFunc: func() runtime.Object { return &example.Pod{} }, NewListFunc: func() runtime.Object { return &example.PodList{} },
		})
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		next := func() byte {
			if len(data) == 0 {
				return 0
			}
			b := data[0]
			data = data[1:]
			return b
		}
		text := func() string {
			n := int(next() % 8)
			if n > len(data) {
				n = len(data)
			}
			s := string(data[:n])
			data = data[n:]
			return s
		}
		for steps := 0; len(data) > 0 && steps < 64; steps++ {
			key := fmt.Sprintf("/pods/ns/p%d", next()%4)
			switch next() % 9 {
			case 0:
				s.Create(ctx, key, &example.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}}, &example.Pod{}, uint64(next()%2))
			case 1:
				s.GuaranteedUpdate(ctx, key, &example.Pod{}, next()%2 == 0, nil, storage.SimpleUpdate(func(o runtime.Object) (runtime.Object, error) {
					p := o.(*example.Pod)
					p.Labels = map[string]string{"n": fmt.Sprint(next())}
					return p, nil
				}), nil)
			case 2:
				s.Delete(ctx, key, &example.Pod{}, nil, storage.ValidateAllObjectFunc, nil, storage.DeleteOptions{})
			case 3:
				s.Get(ctx, key, storage.GetOptions{ResourceVersion: text(), IgnoreNotFound: next()%2 == 0}, &example.Pod{})
			case 4:
				s.GetList(ctx, "/pods/", storage.ListOptions{ResourceVersion: text(), Recursive: true,
					Predicate: storage.SelectionPredicate{Limit: int64(next() % 3), Continue: text(), GetAttrs: storage.DefaultNamespaceScopedAttr}}, &example.PodList{})
			case 5:
				// Garbage bytes where an object should be: reads must fail cleanly.
				backend.Apply(ctx, &fsm.Command{Type: fsm.CmdTxn, Txn: &fsm.Txn{Success: []fsm.Op{{Type: fsm.OpPut, Key: "/registry" + key, Value: []byte(text())}}}})
			case 6:
				if w, err := s.Watch(ctx, "/pods/", storage.ListOptions{ResourceVersion: text(), Recursive: true, Predicate: storage.Everything}); err == nil {
					drain(w.ResultChan(), 3)
					w.Stop()
				}
			case 7:
				backend.Apply(ctx, &fsm.Command{Type: fsm.CmdCompact, CompactRevision: int64(next())})
			case 8:
				s.Stats(ctx)
				s.GetCurrentResourceVersion(ctx)
			}
		}
	})
}

// drain reads up to n events without blocking for long.
func drain(ch <-chan watch.Event, n int) {
	for i := 0; i < n; i++ {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-time.After(10 * time.Millisecond):
			return
		}
	}
}
