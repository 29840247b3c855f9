package fsm

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"
	"sort"
	"strings"

	"github.com/google/btree"
)

// Snapshot stream layout:
//
//	magic "SKIFFSNP" | format version (uvarint) | revision (varint) | applied index (uvarint) | key count (uvarint)
//	records: [recordKV][length uvarint][encoded KeyValue] ...
//	[recordEnd] | SHA-256 of every byte before it
//
// Records are written in key order, so the same state always yields the same bytes.
const (
	snapshotMagic   = "SKIFFSNP"
	snapshotVersion = 1
	recordKV        = 1
	recordEnd       = 0xFF
	// maxRecord bounds one record, so a corrupt length cannot make restore allocate without bound.
	maxRecord = 64 << 20
)

// ErrCorruptSnapshot wraps every reason a snapshot stream is refused.
var ErrCorruptSnapshot = errors.New("corrupt snapshot")

// ErrNewerSnapshot means the snapshot was written in a format newer than this binary reads.
var ErrNewerSnapshot = errors.New("snapshot from a newer skiff")

// Snapshot is a point-in-time copy of the store. Taking one is cheap (the tree is copy-on-write); writing it
// out may happen on another goroutine while the store keeps applying.
type Snapshot struct {
	tree     *btree.BTreeG[*KeyValue]
	revision int64
	applied  uint64
}

// Snapshot captures the store's current state.
func (s *Store) Snapshot() *Snapshot {
	s.mu.Lock() // Clone mutates the source tree's copy-on-write bookkeeping
	defer s.mu.Unlock()
	return &Snapshot{tree: s.tree.Clone(), revision: s.revision, applied: s.applied}
}

// WriteTo streams the snapshot.
func (sn *Snapshot) WriteTo(w io.Writer) (int64, error) {
	sum := sha256.New()
	cw := &countingWriter{w: io.MultiWriter(w, sum)}
	bw := bufio.NewWriterSize(cw, 256<<10)
	var e encoder
	e.buf = append(e.buf, snapshotMagic...)
	e.uvarint(snapshotVersion)
	e.varint(sn.revision)
	e.uvarint(sn.applied)
	e.uvarint(uint64(sn.tree.Len()))
	bw.Write(e.buf)
	var werr error
	var rec, frame encoder
	sn.tree.Ascend(func(kv *KeyValue) bool {
		rec.buf = rec.buf[:0]
		encodeKV(&rec, kv)
		frame.buf = frame.buf[:0]
		frame.byte(recordKV)
		frame.uvarint(uint64(len(rec.buf)))
		if _, werr = bw.Write(frame.buf); werr == nil {
			_, werr = bw.Write(rec.buf)
		}
		return werr == nil
	})
	if werr == nil {
		werr = bw.WriteByte(recordEnd)
	}
	if werr == nil {
		werr = bw.Flush()
	}
	if werr != nil {
		return cw.n, werr
	}
	n, err := w.Write(sum.Sum(nil))
	return cw.n + int64(n), err
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// SnapshotInfo describes a snapshot stream.
type SnapshotInfo struct {
	Version  uint64
	Revision int64
	Applied  uint64
	Keys     int64
	Bytes    int64
	SHA256   string
	// Prefixes counts keys by their first three path segments ("/registry/pods"), sorted by prefix.
	Prefixes []PrefixCount
}

// PrefixCount is one line of SnapshotInfo.Prefixes.
type PrefixCount struct {
	Prefix string
	Keys   int64
}

// snapshotReader parses and verifies a snapshot stream record by record.
type snapshotReader struct {
	r    *bufio.Reader
	sum  hash.Hash
	n    int64
	info SnapshotInfo
}

func newSnapshotReader(r io.Reader) (*snapshotReader, error) {
	sr := &snapshotReader{sum: sha256.New()}
	sr.r = bufio.NewReaderSize(r, 256<<10)
	magic := make([]byte, len(snapshotMagic))
	if err := sr.readFull(magic); err != nil || string(magic) != snapshotMagic {
		return nil, fmt.Errorf("%w: not a Skiff snapshot (bad magic)", ErrCorruptSnapshot)
	}
	var err error
	if sr.info.Version, err = sr.readUvarint(); err != nil {
		return nil, sr.truncated(err)
	}
	switch {
	case sr.info.Version > snapshotVersion:
		return nil, fmt.Errorf("%w: the snapshot's format version %d is newer than this skiff reads (%d): restore it with the skiff that wrote it, or a newer one", ErrNewerSnapshot, sr.info.Version, snapshotVersion)
	case sr.info.Version != snapshotVersion:
		return nil, fmt.Errorf("%w: unsupported snapshot format version %d", ErrCorruptSnapshot, sr.info.Version)
	}
	if sr.info.Revision, err = binary.ReadVarint(byteReaderFunc(sr.readByte)); err != nil {
		return nil, sr.truncated(err)
	}
	if sr.info.Applied, err = sr.readUvarint(); err != nil {
		return nil, sr.truncated(err)
	}
	keys, err := sr.readUvarint()
	if err != nil {
		return nil, sr.truncated(err)
	}
	sr.info.Keys = int64(keys)
	return sr, nil
}

func (sr *snapshotReader) truncated(err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: truncated stream", ErrCorruptSnapshot)
	}
	return err
}

// next returns the next key-value, or nil at the end record after verifying the checksum.
func (sr *snapshotReader) next() (*KeyValue, error) {
	typ, err := sr.readByte()
	if err != nil {
		return nil, sr.truncated(err)
	}
	switch typ {
	case recordEnd:
		want := sr.sum.Sum(nil)
		got := make([]byte, len(want))
		if _, err := io.ReadFull(sr.r, got); err != nil {
			return nil, sr.truncated(err)
		}
		if !bytes.Equal(got, want) {
			return nil, fmt.Errorf("%w: checksum mismatch", ErrCorruptSnapshot)
		}
		sr.info.SHA256 = fmt.Sprintf("%x", want)
		sr.info.Bytes = sr.n + int64(len(got))
		if _, err := sr.r.ReadByte(); err != io.EOF {
			return nil, fmt.Errorf("%w: trailing data after checksum", ErrCorruptSnapshot)
		}
		return nil, nil
	case recordKV:
		n, err := sr.readUvarint()
		if err != nil {
			return nil, sr.truncated(err)
		}
		if n > maxRecord {
			return nil, fmt.Errorf("%w: record of %d bytes", ErrCorruptSnapshot, n)
		}
		buf := make([]byte, n)
		if err := sr.readFull(buf); err != nil {
			return nil, sr.truncated(err)
		}
		d := decoder{buf: buf}
		kv := decodeKV(&d)
		if err := d.done(); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrCorruptSnapshot, err)
		}
		return kv, nil
	default:
		return nil, fmt.Errorf("%w: unknown record type %d", ErrCorruptSnapshot, typ)
	}
}

// The checksum covers every byte before the end record's checksum, so bytes are hashed as they are consumed
// rather than as they are buffered.
func (sr *snapshotReader) readByte() (byte, error) {
	b, err := sr.r.ReadByte()
	if err == nil {
		sr.sum.Write([]byte{b})
		sr.n++
	}
	return b, err
}

func (sr *snapshotReader) readUvarint() (uint64, error) {
	return binary.ReadUvarint(byteReaderFunc(sr.readByte))
}

func (sr *snapshotReader) readFull(p []byte) error {
	n, err := io.ReadFull(sr.r, p)
	sr.sum.Write(p[:n])
	sr.n += int64(n)
	return err
}

type byteReaderFunc func() (byte, error)

func (f byteReaderFunc) ReadByte() (byte, error) { return f() }

// Restore replaces the store's state with the snapshot read from r. The stream is verified completely before
// anything changes; a corrupt or truncated stream is refused with ErrCorruptSnapshot and the store is left as
// it was. Every open watcher is ended with ErrCompacted, so clients relist.
func (s *Store) Restore(r io.Reader) error {
	tree, ttl, info, err := readSnapshot(r)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.tree, s.ttl = tree, ttl
	s.revision = info.Revision
	if info.Applied > s.applied || s.applied == 0 {
		s.applied = info.Applied
	}
	s.history = newHistory(s.opts.HistoryEvents, s.opts.HistoryAge.Nanoseconds(), info.Revision)
	s.epoch++
	wake := s.notify
	s.notify = make(chan struct{})
	s.mu.Unlock()
	close(wake)
	s.restores.Add(1)
	return nil
}

func readSnapshot(r io.Reader) (*btree.BTreeG[*KeyValue], *btree.BTreeG[ttlItem], SnapshotInfo, error) {
	sr, err := newSnapshotReader(r)
	if err != nil {
		return nil, nil, SnapshotInfo{}, err
	}
	tree := btree.NewG(32, kvLess)
	ttl := btree.NewG(32, ttlLess)
	var last string
	for i := int64(0); ; i++ {
		kv, err := sr.next()
		if err != nil {
			return nil, nil, sr.info, err
		}
		if kv == nil {
			if i != sr.info.Keys {
				return nil, nil, sr.info, fmt.Errorf("%w: header says %d keys, stream has %d", ErrCorruptSnapshot, sr.info.Keys, i)
			}
			return tree, ttl, sr.info, nil
		}
		if i > 0 && kv.Key <= last {
			return nil, nil, sr.info, fmt.Errorf("%w: keys out of order at %q", ErrCorruptSnapshot, kv.Key)
		}
		last = kv.Key
		tree.ReplaceOrInsert(kv)
		if kv.ExpiresAt != 0 {
			ttl.ReplaceOrInsert(ttlItem{expiresAt: kv.ExpiresAt, key: kv.Key})
		}
	}
}

// InspectSnapshot verifies a snapshot stream and describes it, without building a store.
func InspectSnapshot(r io.Reader) (SnapshotInfo, error) {
	sr, err := newSnapshotReader(r)
	if err != nil {
		return SnapshotInfo{}, err
	}
	counts := map[string]int64{}
	for {
		kv, err := sr.next()
		if err != nil {
			return sr.info, err
		}
		if kv == nil {
			break
		}
		counts[keyPrefix(kv.Key)]++
	}
	for p, n := range counts {
		sr.info.Prefixes = append(sr.info.Prefixes, PrefixCount{Prefix: p, Keys: n})
	}
	sort.Slice(sr.info.Prefixes, func(i, j int) bool { return sr.info.Prefixes[i].Prefix < sr.info.Prefixes[j].Prefix })
	return sr.info, nil
}

// keyPrefix returns the first three segments of a key path: "/registry/pods/ns/name" -> "/registry/pods".
func keyPrefix(key string) string {
	parts := strings.SplitN(key, "/", 4)
	if len(parts) < 4 {
		return key
	}
	return strings.Join(parts[:3], "/")
}

// RebaseSnapshot copies the snapshot from r to w with every revision and the applied index brought down to
// at most ceiling, and returns what it read. A snapshot from another cluster may run ahead of the Raft log it
// is restored into; since a Skiff revision is the Raft index that wrote it, the restored keys must not carry
// revisions the log has not reached, or the next writes would get lower revisions than what already exists.
// Clamping keeps the order of revisions among the keys (ties aside), which is all a client may rely on.
func RebaseSnapshot(r io.Reader, w io.Writer, ceiling int64) (SnapshotInfo, error) {
	tree, _, info, err := readSnapshot(r)
	if err != nil {
		return info, err
	}
	out := btree.NewG(32, kvLess)
	tree.Ascend(func(kv *KeyValue) bool {
		c := *kv
		c.CreateRevision, c.ModRevision = min(c.CreateRevision, ceiling), min(c.ModRevision, ceiling)
		out.ReplaceOrInsert(&c)
		return true
	})
	sn := &Snapshot{tree: out, revision: min(info.Revision, ceiling), applied: min(info.Applied, uint64(ceiling))}
	_, err = sn.WriteTo(w)
	return info, err
}
