package raftstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/conversion"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/storage"
	"k8s.io/apiserver/pkg/storage/value"
	"k8s.io/apiserver/pkg/storage/value/encrypt/identity"

	"github.com/skiff-dev/skiff/fsm"
	"github.com/skiff-dev/skiff/internal/memshare"
	"github.com/skiff-dev/skiff/raftnode"
)

// Backend is what the storage needs from a Raft peer. *raftnode.Node implements it.
type Backend interface {
	Apply(ctx context.Context, cmd *fsm.Command) (fsm.Result, error)
	LinearizableRead(ctx context.Context) error
	Store() *fsm.Store
}

// Config describes one resource's storage.
type Config struct {
	Backend        Backend
	Codec          runtime.Codec
	Prefix         string // the storage prefix, "/registry"
	ResourcePrefix string // "/pods"
	GroupResource  schema.GroupResource
	NewFunc        func() runtime.Object
	NewListFunc    func() runtime.Object
	// Transformer turns values into what the store holds and back (encryption at rest); nil stores them as
	// the codec writes them.
	Transformer value.Transformer
	// Shared holds the objects this resource's watch cache holds, for the server's informers to share their
	// memory (memshare.Registry); nil keeps them in a registry of this store's own.
	Shared *memshare.Registry
}

// Store is the storage.Interface of one resource.
type Store struct {
	backend        Backend
	codec          runtime.Codec
	versioner      storage.Versioner
	pathPrefix     string // Prefix with a trailing "/"
	resourcePrefix string
	groupResource  schema.GroupResource
	newFunc        func() runtime.Object
	newListFunc    func() runtime.Object
	transformer    atomic.Pointer[transformerHolder]
	compress       bool // values are compressed (compress.go): every resource's but Secrets'
	shared         *memshare.Registry

	mu       sync.Mutex
	watchers map[*watchChan]struct{}
}

var _ storage.Interface = (*Store)(nil)

// New returns the storage of one resource.
func New(c Config) *Store {
	prefix := c.Prefix
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	s := &Store{
		backend: c.Backend, codec: c.Codec, versioner: storage.APIObjectVersioner{},
		pathPrefix: prefix, resourcePrefix: c.ResourcePrefix, groupResource: c.GroupResource,
		newFunc: c.NewFunc, newListFunc: c.NewListFunc, watchers: map[*watchChan]struct{}{}, shared: c.Shared,
		compress: c.GroupResource != schema.GroupResource{Resource: "secrets"},
	}
	if s.shared == nil {
		s.shared = memshare.NewRegistry()
	}
	s.SetTransformer(c.Transformer)
	return s
}

// transformerHolder lets an atomic pointer hold any value.Transformer.
type transformerHolder struct{ value.Transformer }

// SetTransformer replaces the store's value transformer (nil: identity, which refuses encrypted values).
// Watches in flight use the new one from their next event.
func (s *Store) SetTransformer(t value.Transformer) {
	if t == nil {
		t = identity.NewEncryptCheckTransformer()
	}
	s.transformer.Store(&transformerHolder{t})
}

// toStorage turns the codec's bytes for key into what the store holds: encrypted or compressed. The key is
// the authenticated data, as kube-apiserver's etcd3 store uses it, so a value cannot be moved to another key
// unnoticed.
func (s *Store) toStorage(ctx context.Context, key string, data []byte) ([]byte, error) {
	out, err := s.transformer.Load().TransformToStorage(ctx, data, value.DefaultContext(key))
	if err != nil {
		return nil, storage.NewInternalError(fmt.Errorf("encrypting %s: %w", key, err))
	}
	if s.compress {
		out = compressValue(out)
	}
	return out, nil
}

// decodeStored turns what the store holds for key back into an object; stale says the value was written
// with another key or provider than the first one configured, and should be rewritten.
func (s *Store) decodeStored(ctx context.Context, key string, stored []byte, into runtime.Object, rev int64) (data []byte, stale bool, err error) {
	if stored, err = decompressValue(stored); err != nil {
		return nil, false, storage.NewInternalError(fmt.Errorf("%s: %w", key, err))
	}
	data, stale, err = s.transformer.Load().TransformFromStorage(ctx, stored, value.DefaultContext(key))
	if err != nil {
		return nil, false, storage.NewInternalError(fmt.Errorf("cannot decrypt %s: check the servers' encryption configuration (its keys must include the one that wrote it): %w", key, err))
	}
	return data, stale, s.decode(data, into, rev)
}

// Versioner implements storage.Interface.
func (s *Store) Versioner() storage.Versioner { return s.versioner }

func (s *Store) prepareKey(key string, recursive bool) (string, error) {
	key, err := storage.PrepareKey(s.resourcePrefix, key, recursive)
	if err != nil {
		return "", err
	}
	return s.pathPrefix + strings.TrimPrefix(key, "/"), nil
}

// apply proposes a command and maps the Raft layer's errors to API errors.
func (s *Store) apply(ctx context.Context, cmd *fsm.Command) (fsm.Result, error) {
	res, err := s.backend.Apply(ctx, cmd)
	return res, MapBackendError(err)
}

// MapBackendError turns "no leader" (the request certainly did nothing) into 503 with Retry-After, and
// "outcome unknown" into a 504 timeout without one, as kube-apiserver answers a write that timed out.
// client-go resends any request answered 5xx with a Retry-After header: resent, a write that took effect
// would fail with 409 or 404, and its client would believe it never happened.
func MapBackendError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, raftnode.ErrUnknownOutcome):
		return apierrors.NewTimeoutError(err.Error(), 0)
	case errors.Is(err, raftnode.ErrNoLeader), errors.Is(err, raftnode.ErrNotLeader), errors.Is(err, raftnode.ErrShutdown):
		return &apierrors.StatusError{ErrStatus: metav1.Status{
			Status: metav1.StatusFailure, Code: http.StatusServiceUnavailable, Reason: metav1.StatusReasonServiceUnavailable,
			Message: "the cluster has no leader right now: " + err.Error(), Details: &metav1.StatusDetails{RetryAfterSeconds: 1},
		}}
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return apierrors.NewTimeoutError("storage operation did not complete: "+err.Error(), 0)
	}
	return err
}

// readAt makes the local store good for a read with the given resourceVersion: linearizable for "", local
// for "0", and at least minRV otherwise (waiting briefly for this peer to catch up).
func (s *Store) readAt(ctx context.Context, resourceVersion string) error {
	switch resourceVersion {
	case "":
		return MapBackendError(s.backend.LinearizableRead(ctx))
	case "0":
		return nil
	}
	minRV, err := s.versioner.ParseResourceVersion(resourceVersion)
	if err != nil {
		return apierrors.NewBadRequest(fmt.Sprintf("invalid resource version: %v", err))
	}
	return s.waitRevision(ctx, minRV)
}

// waitRevision waits up to a second for the local store to reach rev; a peer that stays behind answers with
// the library's "too large resource version" error, which clients retry.
func (s *Store) waitRevision(ctx context.Context, rev uint64) error {
	st := s.backend.Store()
	if uint64(st.Revision()) >= rev {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	st.WaitApplied(rev, ctx.Done())
	if cur := uint64(st.Revision()); cur < rev {
		return storage.NewTooLargeResourceVersionError(rev, cur, 1)
	}
	return nil
}

func (s *Store) decode(data []byte, into runtime.Object, rev int64) error {
	if _, err := conversion.EnforcePtr(into); err != nil {
		return fmt.Errorf("unable to convert output object to pointer: %v", err)
	}
	if _, _, err := s.codec.Decode(data, nil, into); err != nil {
		return storage.NewCorruptObjError(string(""), err)
	}
	return s.versioner.UpdateObject(into, uint64(rev))
}

// Create implements storage.Interface.
func (s *Store) Create(ctx context.Context, key string, obj, out runtime.Object, ttl uint64) error {
	key, err := s.prepareKey(key, false)
	if err != nil {
		return err
	}
	if version, err := s.versioner.ObjectResourceVersion(obj); err == nil && version != 0 {
		return storage.ErrResourceVersionSetOnCreate
	}
	if err := s.versioner.PrepareObjectForStorage(obj); err != nil {
		return fmt.Errorf("PrepareObjectForStorage failed: %v", err)
	}
	data, err := runtime.Encode(s.codec, obj)
	if err != nil {
		return err
	}
	stored, err := s.toStorage(ctx, key, data)
	if err != nil {
		return err
	}
	res, err := s.apply(ctx, &fsm.Command{Type: fsm.CmdCreate, Key: key, Value: stored, ExpiresAt: expiry(ttl)})
	if err != nil {
		return err
	}
	if errors.Is(res.Err(), fsm.ErrAlreadyExists) {
		return storage.NewKeyExistsError(key, 0)
	}
	if err := res.Err(); err != nil {
		return err
	}
	if out != nil {
		return s.decode(data, out, res.KV.ModRevision)
	}
	return nil
}

// expiry turns a TTL in seconds into the absolute time the store keeps. It is computed here, before the
// command is proposed, never inside Apply.
func expiry(ttl uint64) int64 {
	if ttl == 0 {
		return 0
	}
	return time.Now().Add(time.Duration(ttl) * time.Second).UnixNano()
}

// ttlOf returns the remaining TTL in seconds of a stored key, as etcd's lease would report it.
func ttlOf(kv *fsm.KeyValue) int64 {
	if kv == nil || kv.ExpiresAt == 0 {
		return 0
	}
	left := time.Until(time.Unix(0, kv.ExpiresAt))
	if left <= 0 {
		return 1
	}
	return int64((left + time.Second - 1) / time.Second)
}

// Get implements storage.Interface.
func (s *Store) Get(ctx context.Context, key string, opts storage.GetOptions, out runtime.Object) error {
	key, err := s.prepareKey(key, false)
	if err != nil {
		return err
	}
	if err := s.readAt(ctx, opts.ResourceVersion); err != nil {
		return err
	}
	kv, _, err := s.backend.Store().Get(key)
	if errors.Is(err, fsm.ErrNotFound) {
		if opts.IgnoreNotFound {
			return runtime.SetZeroValue(out)
		}
		return storage.NewKeyNotFoundError(key, 0)
	}
	_, _, err = s.decodeStored(ctx, key, kv.Value, out, kv.ModRevision)
	return err
}

// objState is an object as read from the store, with what a conditional write needs.
type objState struct {
	obj   runtime.Object
	meta  *storage.ResponseMeta
	rev   int64
	data  []byte // as the codec wrote it (before the transformer)
	stale bool   // stored with another key or provider than the first: an update must rewrite it
}

func (s *Store) stateFromKV(kv *fsm.KeyValue, v reflect.Value, ignoreNotFound bool, key string) (*objState, error) {
	st := &objState{obj: reflect.New(v.Type()).Interface().(runtime.Object), meta: &storage.ResponseMeta{}}
	if kv == nil {
		if !ignoreNotFound {
			return nil, storage.NewKeyNotFoundError(key, 0)
		}
		if err := runtime.SetZeroValue(st.obj); err != nil {
			return nil, err
		}
		return st, nil
	}
	st.rev = kv.ModRevision
	st.meta.ResourceVersion = uint64(kv.ModRevision)
	st.meta.TTL = ttlOf(kv)
	var err error
	if st.data, st.stale, err = s.decodeStored(context.TODO(), key, kv.Value, st.obj, kv.ModRevision); err != nil {
		return nil, err
	}
	return st, nil
}

// currentState reads the key from the local store. Conditional writes carry the mod revision they read, so a
// stale local read costs a retry, never a lost update.
func (s *Store) currentState(key string, v reflect.Value, ignoreNotFound bool) (*objState, error) {
	kv, _, err := s.backend.Store().Get(key)
	if err != nil && !errors.Is(err, fsm.ErrNotFound) {
		return nil, err
	}
	return s.stateFromKV(kv, v, ignoreNotFound, key)
}

func (s *Store) stateFromObject(obj runtime.Object) (*objState, error) {
	rv, err := s.versioner.ObjectResourceVersion(obj)
	if err != nil {
		return nil, fmt.Errorf("couldn't get resource version: %v", err)
	}
	// Encode without the resourceVersion, as it is stored.
	if err := s.versioner.PrepareObjectForStorage(obj); err != nil {
		return nil, err
	}
	data, err := runtime.Encode(s.codec, obj)
	if err != nil {
		return nil, err
	}
	if err := s.versioner.UpdateObject(obj, rv); err != nil {
		return nil, err
	}
	return &objState{obj: obj, meta: &storage.ResponseMeta{ResourceVersion: rv}, rev: int64(rv), data: data}, nil
}

// startState is where a conditional write starts: the caller's cached object when it gave one (current is
// false: a precondition or update failure must then be rechecked against the store), else the stored one.
func (s *Store) startState(key string, v reflect.Value, ignoreNotFound bool, cached runtime.Object) (st *objState, current bool, err error) {
	if cached != nil {
		st, err = s.stateFromObject(cached)
		return st, false, err
	}
	st, err = s.currentState(key, v, ignoreNotFound)
	return st, true, err
}

// Delete implements storage.Interface.
func (s *Store) Delete(ctx context.Context, key string, out runtime.Object, preconditions *storage.Preconditions,
	validateDeletion storage.ValidateObjectFunc, cachedExistingObject runtime.Object, opts storage.DeleteOptions) error {
	key, err := s.prepareKey(key, false)
	if err != nil {
		return err
	}
	v, err := conversion.EnforcePtr(out)
	if err != nil {
		return fmt.Errorf("unable to convert output object to pointer: %v", err)
	}
	orig, current, err := s.startState(key, v, false, cachedExistingObject)
	if err != nil {
		if !storage.IsNotFound(err) {
			return err
		}
		if err := s.readAt(ctx, ""); err != nil {
			return err
		}
		if orig, err = s.currentState(key, v, false); err != nil {
			return err
		}
	}
	current = false
	for {
		checkErr := preconditions.Check(key, orig.obj)
		if checkErr == nil && validateDeletion != nil {
			checkErr = validateDeletion(ctx, orig.obj)
		}
		if checkErr != nil {
			if current {
				return checkErr
			}
			// The cached object may be stale: decide on the stored one.
			cachedRev := orig.rev
			if err := s.readAt(ctx, ""); err != nil {
				return err
			}
			if orig, err = s.currentState(key, v, false); err != nil {
				return err
			}
			current = true
			if orig.rev == cachedRev {
				return checkErr
			}
			continue
		}
		res, err := s.apply(ctx, &fsm.Command{Type: fsm.CmdDelete, Key: key, ExpectedModRevision: orig.rev})
		if err != nil {
			return err
		}
		switch {
		case errors.Is(res.Err(), fsm.ErrNotFound):
			return storage.NewKeyNotFoundError(key, 0)
		case errors.Is(res.Err(), fsm.ErrConflict):
			// The result carries the current value: no second read.
			if orig, err = s.stateFromKV(res.KV, v, false, key); err != nil {
				return err
			}
			current = true
			continue
		case res.Err() != nil:
			return res.Err()
		}
		return s.decode(orig.data, out, res.Revision)
	}
}

// GuaranteedUpdate implements storage.Interface: a compare-and-swap loop on the mod revision.
func (s *Store) GuaranteedUpdate(ctx context.Context, key string, destination runtime.Object, ignoreNotFound bool,
	preconditions *storage.Preconditions, tryUpdate storage.UpdateFunc, cachedExistingObject runtime.Object) error {
	key, err := s.prepareKey(key, false)
	if err != nil {
		return err
	}
	v, err := conversion.EnforcePtr(destination)
	if err != nil {
		return fmt.Errorf("unable to convert output object to pointer: %v", err)
	}
	orig, current, err := s.startState(key, v, ignoreNotFound, cachedExistingObject)
	if err != nil {
		if !storage.IsNotFound(err) {
			return err
		}
		if err := s.readAt(ctx, ""); err != nil {
			return err
		}
		if orig, err = s.currentState(key, v, ignoreNotFound); err != nil {
			return err
		}
	}
	current = false
	for {
		if err := preconditions.Check(key, orig.obj); err != nil {
			if current {
				return err
			}
			if err := s.readAt(ctx, ""); err != nil {
				return err
			}
			if orig, err = s.currentState(key, v, ignoreNotFound); err != nil {
				return err
			}
			current = true
			continue
		}
		ret, ttl, err := tryUpdate(orig.obj, *orig.meta)
		if err != nil {
			if current {
				return err
			}
			cachedRev, cachedErr := orig.rev, err
			if err := s.readAt(ctx, ""); err != nil {
				return err
			}
			if orig, err = s.currentState(key, v, ignoreNotFound); err != nil {
				return err
			}
			current = true
			if orig.rev == cachedRev {
				return cachedErr
			}
			continue
		}
		if err := s.versioner.PrepareObjectForStorage(ret); err != nil {
			return fmt.Errorf("PrepareObjectForStorage failed: %v", err)
		}
		data, err := runtime.Encode(s.codec, ret)
		if err != nil {
			return err
		}
		if orig.rev != 0 && !orig.stale && bytes.Equal(data, orig.data) && (ttl == nil || *ttl == uint64(orig.meta.TTL)) {
			// Unchanged: no write. A cached object must first be confirmed against the store.
			if !current {
				if err := s.readAt(ctx, ""); err != nil {
					return err
				}
				if orig, err = s.currentState(key, v, ignoreNotFound); err != nil {
					return err
				}
				current = true
				if orig.stale || !bytes.Equal(data, orig.data) {
					continue
				}
			}
			return s.decode(orig.data, destination, orig.rev)
		}
		var expiresAt int64
		if ttl != nil {
			expiresAt = expiry(*ttl)
		}
		stored, err := s.toStorage(ctx, key, data)
		if err != nil {
			return err
		}
		cmd := &fsm.Command{Type: fsm.CmdUpdate, Key: key, Value: stored, ExpectedModRevision: orig.rev, ExpiresAt: expiresAt}
		if orig.rev == 0 {
			cmd = &fsm.Command{Type: fsm.CmdCreate, Key: key, Value: stored, ExpiresAt: expiresAt}
		}
		res, err := s.apply(ctx, cmd)
		if err != nil {
			return err
		}
		switch {
		case errors.Is(res.Err(), fsm.ErrConflict), errors.Is(res.Err(), fsm.ErrAlreadyExists):
			if orig, err = s.stateFromKV(res.KV, v, ignoreNotFound, key); err != nil {
				return err
			}
			current = true
			continue
		case errors.Is(res.Err(), fsm.ErrNotFound):
			// Deleted since we read it.
			if orig, err = s.stateFromKV(nil, v, ignoreNotFound, key); err != nil {
				return err
			}
			current = true
			continue
		case res.Err() != nil:
			return res.Err()
		}
		return s.decode(data, destination, res.KV.ModRevision)
	}
}

// Stats implements storage.Interface.
func (s *Store) Stats(ctx context.Context) (storage.Stats, error) {
	prefix, err := s.prepareKey(s.resourcePrefix, true)
	if err != nil {
		return storage.Stats{}, err
	}
	n, _ := s.backend.Store().Count(prefix)
	return storage.Stats{ObjectCount: n}, nil
}

// EnableResourceSizeEstimation implements storage.Interface; sizes are not estimated.
func (s *Store) EnableResourceSizeEstimation(storage.KeysFunc) error { return nil }

// ReadinessCheck implements storage.Interface.
func (s *Store) ReadinessCheck() error { return nil }

// GetCurrentResourceVersion implements storage.Interface: the store's revision after a linearizable read.
func (s *Store) GetCurrentResourceVersion(ctx context.Context) (uint64, error) {
	if err := MapBackendError(s.backend.LinearizableRead(ctx)); err != nil {
		return 0, err
	}
	rev := s.backend.Store().Revision()
	if rev == 0 {
		return 0, fmt.Errorf("the current resource version must be greater than 0")
	}
	return uint64(rev), nil
}

// CompactRevision implements storage.Interface.
func (s *Store) CompactRevision() int64 { return s.backend.Store().CompactedRevision() }

// ReadKey reads one key's value after a linearizable read, for the few server paths that look at a stored
// object outside its resource's storage (found false when it is absent); a compressed value is returned
// decompressed, an encrypted one as it is. The value may be the store's: do not change it.
func ReadKey(ctx context.Context, backend Backend, key string) (value []byte, found bool, err error) {
	if err := backend.LinearizableRead(ctx); err != nil {
		return nil, false, MapBackendError(err)
	}
	kv, _, err := backend.Store().Get(key)
	if errors.Is(err, fsm.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	if value, err = decompressValue(kv.Value); err != nil {
		return nil, false, fmt.Errorf("%s: %w", key, err)
	}
	return value, true, nil
}
