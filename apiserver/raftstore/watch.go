package raftstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/apiserver/pkg/features"
	"k8s.io/apiserver/pkg/storage"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	utilflowcontrol "k8s.io/apiserver/pkg/util/flowcontrol"

	"github.com/skiff-dev/skiff/fsm"
)

const resultBuffer = 100

// watchChan is one watch: optional initial events from a snapshot of the store, then the store's history
// from that revision on, decoded, filtered and typed as etcd3's watcher does.
type watchChan struct {
	s              *Store
	ctx            context.Context
	cancel         context.CancelFunc
	key            string
	recursive      bool
	pred           storage.SelectionPredicate
	progressNotify bool
	fw             *fsm.Watcher
	result         chan watch.Event
	// remembers says this watch is of a whole resource, unfiltered (the watch cache's own watch): it keeps
	// each object it sends in the store's registry until it sends the next version (memshare.Registry).
	// A new version then shares the memory of the parts it has in common with the one before, since the
	// watch cache keeps both in its event window, and the server's informers share the cache's copy.
	remembers bool
}

// Watch implements storage.Interface.
func (s *Store) Watch(ctx context.Context, key string, opts storage.ListOptions) (watch.Interface, error) {
	key, err := s.prepareKey(key, opts.Recursive)
	if err != nil {
		return nil, err
	}
	rev, err := s.versioner.ParseResourceVersion(opts.ResourceVersion)
	if err != nil {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("invalid resource version: %v", err))
	}
	if opts.ProgressNotify && s.newFunc == nil {
		return nil, apierrors.NewInternalError(errors.New("progressNotify for watch is unsupported because no newFunc was provided"))
	}
	if ctx.Err() != nil {
		// A watch on a finished context is closed at once, without an error.
		wc := &watchChan{result: make(chan watch.Event)}
		close(wc.result)
		wc.cancel = func() {}
		return wc, nil
	}
	watchList := utilfeature.DefaultFeatureGate.Enabled(features.WatchList)
	initialEvents := (opts.SendInitialEvents == nil && rev == 0) ||
		(watchList && opts.SendInitialEvents != nil && *opts.SendInitialEvents)
	endBookmark := watchList && opts.SendInitialEvents != nil && *opts.SendInitialEvents && opts.Predicate.AllowWatchBookmarks

	st := s.backend.Store()
	if rev > 0 && initialEvents {
		if err := s.waitRevision(ctx, rev); err != nil {
			return nil, err
		}
	}
	var initial []*fsm.KeyValue
	if rev == 0 || initialEvents {
		// A fresh watch starts at the latest revision, read linearizably, as etcd's would.
		if err := MapBackendError(s.backend.LinearizableRead(ctx)); err != nil {
			return nil, err
		}
	}
	var fromRev int64
	if initialEvents {
		page := st.Range(key, "", 0)
		fromRev = page.Revision
		for _, kv := range page.KVs {
			if opts.Recursive || kv.Key == key {
				initial = append(initial, kv)
			}
		}
	} else if rev == 0 {
		fromRev = st.Revision()
	} else {
		fromRev = int64(rev)
	}

	wc := &watchChan{s: s, key: key, recursive: opts.Recursive, pred: opts.Predicate, progressNotify: opts.ProgressNotify,
		result: make(chan watch.Event, resultBuffer)}
	if wc.pred.Empty() {
		wc.pred = storage.Everything
		wc.remembers = wc.recursive
	}
	wc.ctx, wc.cancel = context.WithCancel(ctx)
	fw, err := st.Watch(key, fromRev)
	if err != nil {
		go func() {
			defer close(wc.result)
			wc.sendError(err)
		}()
		utilflowcontrol.WatchInitialized(ctx)
		return wc, nil
	}
	wc.fw = fw
	s.mu.Lock()
	s.watchers[wc] = struct{}{}
	s.mu.Unlock()
	go wc.run(initial, fromRev, endBookmark)
	if wc.progressNotify {
		go wc.notifyProgressPeriodically()
	}
	utilflowcontrol.WatchInitialized(ctx)
	return wc, nil
}

// RequestWatchProgress implements storage.Interface: every progress-notifying watch of this resource gets a
// bookmark at the store's revision once it has delivered everything before it. The revision is global, so
// this is how the watch cache learns it is current even when this resource is quiet.
func (s *Store) RequestWatchProgress(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for wc := range s.watchers {
		if wc.progressNotify {
			wc.fw.RequestProgress()
		}
	}
	return nil
}

// progressInterval is how often a progress-notifying watch gets a bookmark when nothing else asks for one,
// as etcd's watch-progress-notify-interval does.
var progressInterval = 5 * time.Second

func (wc *watchChan) notifyProgressPeriodically() {
	t := time.NewTicker(progressInterval)
	defer t.Stop()
	for {
		select {
		case <-wc.ctx.Done():
			return
		case <-t.C:
			wc.fw.RequestProgress()
		}
	}
}

func (wc *watchChan) ResultChan() <-chan watch.Event { return wc.result }

func (wc *watchChan) Stop() { wc.cancel() }

func (wc *watchChan) run(initial []*fsm.KeyValue, fromRev int64, endBookmark bool) {
	defer func() {
		wc.s.mu.Lock()
		delete(wc.s.watchers, wc)
		wc.s.mu.Unlock()
		wc.fw.Close()
		wc.cancel()
		if wc.remembers {
			// Once ended, this watch no longer learns of what it holds changing or going.
			wc.s.shared.Release(wc)
		}
		close(wc.result)
	}()
	for _, kv := range initial {
		obj, err := wc.decode(kv.Key, kv.Value, kv.ModRevision)
		if err != nil {
			wc.sendError(err)
			return
		}
		wc.remember(obj, false)
		if wc.matches(obj) && !wc.send(watch.Event{Type: watch.Added, Object: obj}) {
			return
		}
	}
	if endBookmark {
		obj, err := wc.bookmark(fromRev)
		if err == nil {
			err = storage.AnnotateInitialEventsEndBookmark(obj)
		}
		if err != nil {
			wc.sendError(err)
			return
		}
		if !wc.send(watch.Event{Type: watch.Bookmark, Object: obj}) {
			return
		}
	}
	for {
		events, err := wc.fw.Next(wc.ctx)
		if err != nil {
			if wc.ctx.Err() == nil {
				wc.sendError(err)
			}
			return
		}
		for _, ev := range events {
			out, err := wc.transform(ev)
			if err != nil {
				wc.sendError(err)
				return
			}
			if out != nil && !wc.send(*out) {
				return
			}
		}
	}
}

func (wc *watchChan) decode(key string, stored []byte, rev int64) (runtime.Object, error) {
	obj := wc.s.newFunc()
	if _, _, err := wc.s.decodeStored(wc.ctx, key, stored, obj, rev); err != nil {
		return nil, err
	}
	return obj, nil
}

// remember shares obj's memory with the version held before it, if this watch remembers, and holds obj in
// its place; a deleted object is forgotten.
func (wc *watchChan) remember(obj runtime.Object, deleted bool) {
	switch {
	case !wc.remembers:
	case deleted:
		wc.s.shared.Forget(obj)
	default:
		wc.s.shared.Remember(obj, wc)
	}
}

func (wc *watchChan) bookmark(rev int64) (runtime.Object, error) {
	obj := wc.s.newFunc()
	if err := wc.s.versioner.UpdateObject(obj, uint64(rev)); err != nil {
		return nil, err
	}
	return obj, nil
}

func (wc *watchChan) matches(obj runtime.Object) bool {
	ok, err := wc.pred.Matches(obj)
	return err == nil && ok
}

// transform turns a store event into a watch event, or nil when the filter drops it. An update that moves
// the object into or out of the filter becomes ADDED or DELETED, as etcd3's watcher does.
func (wc *watchChan) transform(ev fsm.Event) (*watch.Event, error) {
	if ev.Type == fsm.EventProgress {
		if !wc.progressNotify {
			return nil, nil
		}
		obj, err := wc.bookmark(ev.Revision)
		if err != nil {
			return nil, err
		}
		return &watch.Event{Type: watch.Bookmark, Object: obj}, nil
	}
	if !wc.recursive && ev.KV.Key != wc.key {
		return nil, nil
	}
	if wc.recursive && !strings.HasPrefix(ev.KV.Key, wc.key) {
		return nil, nil
	}
	switch ev.Type {
	case fsm.EventDelete:
		// The deleted object carries the deleting revision.
		old, err := wc.decode(ev.KV.Key, ev.Prev.Value, ev.Revision)
		if err != nil {
			return nil, err
		}
		wc.remember(old, true)
		if !wc.matches(old) {
			return nil, nil
		}
		return &watch.Event{Type: watch.Deleted, Object: old}, nil
	case fsm.EventCreate:
		cur, err := wc.decode(ev.KV.Key, ev.KV.Value, ev.KV.ModRevision)
		if err != nil {
			return nil, err
		}
		wc.remember(cur, false)
		if !wc.matches(cur) {
			return nil, nil
		}
		return &watch.Event{Type: watch.Added, Object: cur}, nil
	}
	cur, err := wc.decode(ev.KV.Key, ev.KV.Value, ev.KV.ModRevision)
	if err != nil {
		return nil, err
	}
	wc.remember(cur, false)
	if wc.pred.Empty() {
		return &watch.Event{Type: watch.Modified, Object: cur}, nil
	}
	old, err := wc.decode(ev.KV.Key, ev.Prev.Value, ev.Prev.ModRevision)
	if err != nil {
		return nil, err
	}
	curOK, oldOK := wc.matches(cur), wc.matches(old)
	switch {
	case curOK && oldOK:
		return &watch.Event{Type: watch.Modified, Object: cur}, nil
	case curOK:
		return &watch.Event{Type: watch.Added, Object: cur}, nil
	case oldOK:
		// The object left the filter: the watcher sees its previous state, at the revision it left.
		if err := wc.s.versioner.UpdateObject(old, uint64(ev.Revision)); err != nil {
			return nil, err
		}
		return &watch.Event{Type: watch.Deleted, Object: old}, nil
	}
	return nil, nil
}

func (wc *watchChan) send(ev watch.Event) bool {
	select {
	case wc.result <- ev:
		return true
	case <-wc.ctx.Done():
		return false
	}
}

// sendError delivers an error event: 410 Expired for a compacted revision or a watcher cut off for falling
// behind (the client relists), 500 otherwise.
func (wc *watchChan) sendError(err error) {
	if errors.Is(err, fsm.ErrCompacted) {
		err = apierrors.NewResourceExpired("The resourceVersion for the provided watch is too old.")
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		status = apierrors.NewInternalError(err)
	}
	st := status.Status()
	select {
	case wc.result <- watch.Event{Type: watch.Error, Object: &st}:
	case <-wc.ctx.Done():
	}
}
