package raftstore

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/conversion"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/storage"

	"github.com/skiff-dev/skiff/fsm"
)

const (
	msgExpired              = "The resourceVersion for the provided list is too old."
	msgInconsistentContinue = "The provided continue parameter is too old to display a consistent list result. " +
		"You can start a new list without the continue parameter, or use the continue token in this response to " +
		"retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - " +
		"objects that were created, modified, or deleted between the time the first chunk was returned and now may " +
		"show up in the list."
)

// maxPage bounds how many keys one store read returns while a filtered, limited list fills its page.
const maxPage = 10000

// GetList implements storage.Interface. Every page of a list is read at one revision: the current one for a
// fresh list, the continue token's for later pages (from the store's history, see fsm.RangeAt).
func (s *Store) GetList(ctx context.Context, key string, opts storage.ListOptions, listObj runtime.Object) error {
	keyPrefix, err := s.prepareKey(key, opts.Recursive)
	if err != nil {
		return err
	}
	listPtr, err := meta.GetItemsPtr(listObj)
	if err != nil {
		return err
	}
	v, err := conversion.EnforcePtr(listPtr)
	if err != nil || v.Kind() != reflect.Slice {
		return fmt.Errorf("need ptr to slice: %v", err)
	}
	newItem := newItemFunc(listObj, v)
	withRev, continueKey, err := storage.ValidateListOptions(keyPrefix, s.versioner, opts)
	if err != nil {
		return err
	}
	st := s.backend.Store()
	switch {
	case withRev != 0:
		if err := s.waitRevision(ctx, uint64(withRev)); err != nil {
			return err
		}
	case len(opts.Predicate.Continue) > 0:
		// A token asking for "the latest" revision.
	default:
		if err := s.readAt(ctx, opts.ResourceVersion); err != nil {
			return err
		}
	}
	if withRev == 0 {
		withRev = st.Revision()
	}

	if !opts.Recursive {
		return s.getSingle(keyPrefix, opts, listObj, v, newItem, withRev)
	}

	pred := opts.Predicate
	paging := pred.Limit > 0
	start := keyPrefix
	if continueKey != "" {
		start = continueKey
	}
	var lastKey string
	hasMore := false
	batch := int(pred.Limit)
pages:
	for {
		page, err := st.RangeAt(keyPrefix, start, batch, withRev)
		if err != nil {
			return s.listReadError(err, withRev, len(pred.Continue) > 0, start, keyPrefix)
		}
		for _, kv := range page.KVs {
			if paging && int64(v.Len()) >= pred.Limit {
				hasMore = true // the page is full and this key is left for the next one
				break pages
			}
			lastKey = kv.Key
			obj := newItem()
			if _, _, err := s.decodeStored(ctx, kv.Key, kv.Value, obj, kv.ModRevision); err != nil {
				return internalError(kv.Key, err)
			}
			if ok, err := pred.Matches(obj); err == nil && ok {
				v.Set(reflect.Append(v, reflect.ValueOf(obj).Elem()))
			}
		}
		if !page.More {
			break
		}
		if paging && int64(v.Len()) >= pred.Limit {
			hasMore = true
			break
		}
		start = lastKey + "\x00"
		if batch < maxPage { // the predicate dropped items: read more per round
			batch = min(batch*2, maxPage)
		}
	}
	var count int64
	if hasMore && pred.Empty() {
		// Keys from the first one of this page to the end, as etcd counts them for remainingItemCount.
		rest, err := st.RangeAt(keyPrefix, firstKeyOf(continueKey, keyPrefix), 0, withRev)
		if err != nil {
			return s.listReadError(err, withRev, len(pred.Continue) > 0, start, keyPrefix)
		}
		count = int64(len(rest.KVs))
	}
	cont, remaining, err := storage.PrepareContinueToken(lastKey, keyPrefix, withRev, count, hasMore, opts)
	if err != nil {
		return err
	}
	if v.IsNil() {
		v.Set(reflect.MakeSlice(v.Type(), 0, 0))
	}
	return s.versioner.UpdateList(listObj, uint64(withRev), cont, remaining)
}

func firstKeyOf(continueKey, keyPrefix string) string {
	if continueKey != "" {
		return continueKey
	}
	return keyPrefix
}

// getSingle answers a non-recursive list: the one object at the key, if it matches.
func (s *Store) getSingle(key string, opts storage.ListOptions, listObj runtime.Object, v reflect.Value, newItem func() runtime.Object, rev int64) error {
	page, err := s.backend.Store().RangeAt(key, key, 1, rev)
	if err != nil {
		return s.listReadError(err, rev, false, key, key)
	}
	if len(page.KVs) == 1 && page.KVs[0].Key == key {
		kv := page.KVs[0]
		obj := newItem()
		if _, _, err := s.decodeStored(context.TODO(), kv.Key, kv.Value, obj, kv.ModRevision); err != nil {
			return internalError(kv.Key, err)
		}
		if ok, err := opts.Predicate.Matches(obj); err == nil && ok {
			v.Set(reflect.Append(v, reflect.ValueOf(obj).Elem()))
		}
	}
	if v.IsNil() {
		v.Set(reflect.MakeSlice(v.Type(), 0, 0))
	}
	return s.versioner.UpdateList(listObj, uint64(rev), "", nil)
}

// listReadError maps a history read failure as etcd3's store does: 410 for a compacted revision, with a
// token to continue inconsistently when paging.
func (s *Store) listReadError(err error, rev int64, paging bool, continueKey, keyPrefix string) error {
	switch {
	case errors.Is(err, fsm.ErrFutureRevision):
		return storage.NewTooLargeResourceVersionError(uint64(rev), uint64(s.backend.Store().Revision()), 1)
	case errors.Is(err, fsm.ErrCompacted):
		if !paging {
			return apierrors.NewResourceExpired(msgExpired)
		}
		token, tokErr := storage.EncodeContinue(continueKey, keyPrefix, -1)
		if tokErr != nil {
			return apierrors.NewResourceExpired(msgExpired)
		}
		st := apierrors.NewResourceExpired(msgInconsistentContinue)
		st.ErrStatus.ListMeta.Continue = token
		return st
	}
	return err
}

func newItemFunc(listObj runtime.Object, v reflect.Value) func() runtime.Object {
	if ul, ok := listObj.(*unstructured.UnstructuredList); ok {
		if apiVersion := ul.GetAPIVersion(); apiVersion != "" {
			return func() runtime.Object {
				return &unstructured.Unstructured{Object: map[string]interface{}{"apiVersion": apiVersion}}
			}
		}
	}
	elem := v.Type().Elem()
	return func() runtime.Object { return reflect.New(elem).Interface().(runtime.Object) }
}

// internalError is a failure to read a stored value as a storage internal error (decodeStored's already
// is one).
func internalError(key string, err error) error {
	if storage.IsInternalError(err) {
		return err
	}
	return storage.NewInternalError(fmt.Errorf("decoding %s: %w", key, err))
}
