// Package fsm is Skiff's replicated state machine: a revisioned key-value store with the semantics the
// Kubernetes API server expects from etcd.
//
// It owns:
//   - a single global revision, equal to the Raft index of the entry that made the last change;
//   - per-key create and mod revisions, optional expiry times (TTL keys);
//   - the typed, versioned commands that change the store (create, compare-and-swap update and delete,
//     atomic Txn, no-op), registered in one table;
//   - a bounded watch history with replay-then-live subscriptions and progress notifications;
//   - streamed snapshots with a versioned header and a checksum.
//
// Values are opaque bytes: no Kubernetes type lives here. Apply is deterministic: it reads no clock, draws no
// random number and never depends on map iteration order, so the same log yields byte-identical snapshots on
// every peer. Every time the store needs (history age, expiry) comes inside the command, chosen by the
// proposer. The package imports no other Skiff package and does no I/O beyond snapshot streams.
package fsm
