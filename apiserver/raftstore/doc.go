// Package raftstore implements k8s.io/apiserver's storage.Interface over Skiff's Raft-replicated store, the
// way the library's etcd3 store does over etcd. Objects are encoded with the given codec (protobuf, as
// kube-apiserver stores them) and kept under <prefix>/<resource>/... keys. resourceVersion is the store's mod
// revision, which is the Raft index of the write.
//
// Writes go through raftnode (forwarded to the leader from any peer); reads with resourceVersion "" are
// linearizable through the ReadIndex path; watches read the store's history ring. It is the only way the API
// server reaches the store.
package raftstore
