package fsm

import (
	"crypto/sha256"
	"encoding/hex"
)

// stateHashDomain opens every state digest, so that a digest can never be mistaken for the checksum of a
// snapshot stream or of another layout. Change the version when the hashed layout changes.
const stateHashDomain = "skiff-state-v1\x00"

// StateHash returns the last applied Raft index and a digest of the store's replicated state at exactly that
// index: SHA-256, in hex. Replicas that applied the same log hash equal, and a store restored from a snapshot
// hashes equal to the store that took it.
//
// The digest covers what a snapshot carries: the store's revision and every key in key order with its value,
// create and mod revisions and expiry. It leaves out what is local to a replica: the watch history (its size
// is a local option, and a restore starts it afresh), watchers, and counters. The applied index is returned
// beside the digest rather than inside it, so that callers compare both.
//
// The state is captured as Snapshot captures it, in O(1) under the lock; the hashing runs outside it, so
// Apply is not held up.
func (s *Store) StateHash() (appliedIndex uint64, hash string) {
	sn := s.Snapshot()
	return sn.applied, sn.StateHash()
}

// AppliedIndex returns the Raft index the snapshot was taken at.
func (sn *Snapshot) AppliedIndex() uint64 { return sn.applied }

// StateHash returns the digest of the snapshot's state, as Store.StateHash describes it.
//
// Hashed layout: the domain string | revision (varint) | key count (uvarint) | per key, in key order:
// [length uvarint][encoded KeyValue], the same record a snapshot stream holds.
func (sn *Snapshot) StateHash() string {
	sum := sha256.New()
	var e encoder
	e.buf = append(e.buf, stateHashDomain...)
	e.varint(sn.revision)
	e.uvarint(uint64(sn.tree.Len()))
	sum.Write(e.buf)
	var rec, frame encoder
	sn.tree.Ascend(func(kv *KeyValue) bool {
		rec.buf = rec.buf[:0]
		encodeKV(&rec, kv)
		frame.buf = frame.buf[:0]
		frame.uvarint(uint64(len(rec.buf)))
		sum.Write(frame.buf)
		sum.Write(rec.buf)
		return true
	})
	return hex.EncodeToString(sum.Sum(nil))
}
