// Package memshare lets a newly decoded version of an object reuse the memory of the version before it
// wherever the two hold equal values.
//
// Why: each server's watch cache keeps every version of an object written in its event window (75 s), each
// decoded on its own. A pod written five times in that window (created, bound, then its status as it starts)
// is five full copies of its spec, labels and managed fields, although only its status and a few fields
// changed. Decoding gives every version its own strings, slices and maps; pointing the new version's
// unchanged parts at the old version's leaves it owning only what changed. The objects are read-only once
// they reach the cache (the apiserver library's cacher hands them out shallow-copied), so two versions may
// share parts as the cacher's own list copies already share theirs with the store.
//
// The same holds across copies: a Registry holds the watch cache's current version of each object, and a
// server's informers, which decode their own copy from the server's API, share it.
package memshare

import (
	"bytes"
	"reflect"
	"sync"
)

// With makes obj reuse prev's memory wherever the two hold equal values, and reports whether they were
// equal throughout. Both must be non-nil pointers to values of one type; otherwise With does nothing and
// reports false. obj's values do not change, only where they are kept: prev must not be changed afterwards,
// and neither may obj's shared parts.
func With(obj, prev any) bool {
	v, p := reflect.ValueOf(obj), reflect.ValueOf(prev)
	if v.Kind() != reflect.Pointer || v.IsNil() || p.Kind() != reflect.Pointer || p.IsNil() || v.Type() != p.Type() {
		return false
	}
	if v.Pointer() == p.Pointer() {
		return true
	}
	return share(v.Elem(), p.Elem())
}

// share makes v, which is settable, reuse old's memory where the values are equal, and reports whether they
// are equal as reflect.DeepEqual judges.
func share(v, old reflect.Value) bool {
	switch v.Kind() {
	case reflect.String:
		if v.String() != old.String() {
			return false
		}
		v.Set(old)
		return true
	case reflect.Pointer:
		if v.IsNil() || old.IsNil() {
			return v.IsNil() && old.IsNil()
		}
		if v.Pointer() == old.Pointer() {
			return true
		}
		if !share(v.Elem(), old.Elem()) {
			return false
		}
		v.Set(old)
		return true
	case reflect.Struct:
		if opaque(v.Type()) {
			return shareWhole(v, old)
		}
		equal := true
		for i := range v.NumField() {
			if !share(v.Field(i), old.Field(i)) {
				equal = false
			}
		}
		return equal
	case reflect.Slice:
		if v.IsNil() || old.IsNil() {
			return v.IsNil() && old.IsNil()
		}
		if v.Type().Elem().Kind() == reflect.Uint8 {
			if !bytes.Equal(v.Bytes(), old.Bytes()) {
				return false
			}
			v.Set(old)
			return true
		}
		// Elements pair up by index: what changes in a list of containers, conditions or managed fields is
		// usually one element, and the others keep their places.
		equal := v.Len() == old.Len()
		for i := range min(v.Len(), old.Len()) {
			if !share(v.Index(i), old.Index(i)) {
				equal = false
			}
		}
		if equal {
			v.Set(old)
		}
		return equal
	case reflect.Map, reflect.Interface:
		// Map values and the value inside an interface cannot be set in place: the whole is shared or not.
		return shareWhole(v, old)
	case reflect.Array:
		equal := true
		for i := range v.Len() {
			if !share(v.Index(i), old.Index(i)) {
				equal = false
			}
		}
		return equal
	case reflect.Func, reflect.Chan, reflect.UnsafePointer:
		return v.IsNil() && old.IsNil()
	default: // booleans and numbers: nothing on the heap
		return v.Equal(old)
	}
}

func shareWhole(v, old reflect.Value) bool {
	if !reflect.DeepEqual(v.Interface(), old.Interface()) {
		return false
	}
	v.Set(old)
	return true
}

var opaqueTypes sync.Map // reflect.Type → bool

// opaque reports whether a struct type has unexported fields, which reflection cannot set one by one (a
// time, a resource quantity): such a value is shared whole when equal.
func opaque(t reflect.Type) bool {
	if o, ok := opaqueTypes.Load(t); ok {
		return o.(bool)
	}
	o := false
	for i := range t.NumField() {
		if !t.Field(i).IsExported() {
			o = true
			break
		}
	}
	opaqueTypes.Store(t, o)
	return o
}
