package fsm

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// errShortBuffer reports a payload that ended before all its fields were read.
var errShortBuffer = errors.New("fsm: truncated payload")

// encoder appends fields to a byte slice. Integers are varints and byte strings are length-prefixed, so the
// encoding is compact and has exactly one form for each value (determinism of snapshots depends on it).
type encoder struct{ buf []byte }

func (e *encoder) uvarint(v uint64) { e.buf = binary.AppendUvarint(e.buf, v) }
func (e *encoder) varint(v int64)   { e.buf = binary.AppendVarint(e.buf, v) }
func (e *encoder) bytes(b []byte)   { e.uvarint(uint64(len(b))); e.buf = append(e.buf, b...) }
func (e *encoder) string(s string)  { e.uvarint(uint64(len(s))); e.buf = append(e.buf, s...) }
func (e *encoder) byte(b byte)      { e.buf = append(e.buf, b) }

func (e *encoder) bool(b bool) {
	if b {
		e.byte(1)
	} else {
		e.byte(0)
	}
}

// decoder reads what encoder wrote. The first error sticks; later reads return zero values, so callers check
// err once at the end.
type decoder struct {
	buf []byte
	err error
}

func (d *decoder) fail(err error) {
	if d.err == nil {
		d.err = err
	}
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.buf)
	if n <= 0 {
		d.fail(errShortBuffer)
		return 0
	}
	d.buf = d.buf[n:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.buf)
	if n <= 0 {
		d.fail(errShortBuffer)
		return 0
	}
	d.buf = d.buf[n:]
	return v
}

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if len(d.buf) < 1 {
		d.fail(errShortBuffer)
		return 0
	}
	b := d.buf[0]
	d.buf = d.buf[1:]
	return b
}

func (d *decoder) bool() bool { return d.byte() != 0 }

// rawBytes returns the next length-prefixed field without copying.
func (d *decoder) rawBytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if uint64(len(d.buf)) < n {
		d.fail(errShortBuffer)
		return nil
	}
	b := d.buf[:n:n]
	d.buf = d.buf[n:]
	return b
}

// bytes returns a copy, so the result never aliases the log entry that raft may reuse.
func (d *decoder) bytes() []byte {
	b := d.rawBytes()
	if b == nil {
		return nil
	}
	return append([]byte(nil), b...)
}

func (d *decoder) string() string { return string(d.rawBytes()) }

// count reads a slice length and refuses one that cannot fit in what is left, so a corrupt length cannot make
// the decoder allocate gigabytes.
func (d *decoder) count() int {
	n := d.uvarint()
	if d.err == nil && n > uint64(len(d.buf)) {
		d.fail(fmt.Errorf("fsm: element count %d exceeds payload", n))
		return 0
	}
	return int(n)
}

func (d *decoder) done() error {
	if d.err == nil && len(d.buf) != 0 {
		d.fail(fmt.Errorf("fsm: %d trailing bytes", len(d.buf)))
	}
	return d.err
}

func encodeKV(e *encoder, kv *KeyValue) {
	e.string(kv.Key)
	e.bytes(kv.Value)
	e.varint(kv.CreateRevision)
	e.varint(kv.ModRevision)
	e.varint(kv.ExpiresAt)
}

func decodeKV(d *decoder) *KeyValue {
	return &KeyValue{
		Key:            d.string(),
		Value:          d.bytes(),
		CreateRevision: d.varint(),
		ModRevision:    d.varint(),
		ExpiresAt:      d.varint(),
	}
}

// encodeOptionalKV writes a presence flag, then the key-value when present.
func encodeOptionalKV(e *encoder, kv *KeyValue) {
	e.bool(kv != nil)
	if kv != nil {
		encodeKV(e, kv)
	}
}

func decodeOptionalKV(d *decoder) *KeyValue {
	if !d.bool() {
		return nil
	}
	return decodeKV(d)
}
