package raftstore

import (
	"bytes"
	"fmt"

	"github.com/klauspost/compress/zstd"
)

// Stored values are compressed with zstd: a pod as the API server stores it (protobuf, with its managed fields
// and status) is about 6 KB, and 1.5 KB compressed. Every server holds each value in its store's memory, with
// the versions of the last minutes in the watch history, and each value also travels through the Raft log and
// the snapshots; at scale the store's values were the largest part of a server's heap. Compression costs
// about 16 µs of CPU where a value is written (once, on the server that proposes it) and 6 µs where it is
// read, against a create that costs the servers about 1.5 ms.
//
// What is compressed is told by its first bytes, the zstd frame's magic number, which no value the codecs
// write starts with (protobuf's "k8s\x00", JSON's "{", CBOR's self-describing tag), so values written before
// compression read as they are. Values encrypted at rest are never compressed (compressing before encrypting
// would make a value's length depend on its content, which an attacker who controls part of it can exploit),
// nor are Secrets, whose stored form the servers' key rotation reads itself.
var zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}

// encryptedPrefix begins every value an encryption-at-rest provider writes ("k8s:enc:aescbc:v1:key1:...").
var encryptedPrefix = []byte("k8s:enc:")

// minCompressed is the smallest value worth compressing: a zstd frame's own overhead is about 10 bytes.
const minCompressed = 128

// maxDecompressed bounds what one stored value may decompress to, so that a corrupt value cannot make a server
// allocate without limit; the API refuses requests over 3 MiB.
const maxDecompressed = 64 << 20

var (
	// EncodeAll and DecodeAll may be called concurrently on one encoder and one decoder.
	valueEncoder, _ = zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithLowerEncoderMem(true))
	valueDecoder, _ = zstd.NewReader(nil, zstd.WithDecoderMaxMemory(maxDecompressed), zstd.WithDecoderConcurrency(0))
)

// compressValue returns what the store holds for a transformed value: compressed, unless it is encrypted,
// small, or does not get smaller.
func compressValue(v []byte) []byte {
	if len(v) < minCompressed || bytes.HasPrefix(v, encryptedPrefix) {
		return v
	}
	z := valueEncoder.EncodeAll(v, make([]byte, 0, len(v)/2))
	if len(z) >= len(v) {
		return v
	}
	return z
}

// decompressValue returns a stored value as it was before compressValue.
func decompressValue(stored []byte) ([]byte, error) {
	if !bytes.HasPrefix(stored, zstdMagic) {
		return stored, nil
	}
	v, err := valueDecoder.DecodeAll(stored, nil)
	if err != nil {
		return nil, fmt.Errorf("decompressing a stored value: %w", err)
	}
	return v, nil
}
