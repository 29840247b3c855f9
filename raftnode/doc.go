// Package raftnode wires hashicorp/raft around the fsm store: durable raft-boltdb log and stable stores,
// file snapshots, a TCP transport with a pluggable connection layer, bootstrap, membership changes,
// leadership notifications, write forwarding from followers to the leader, and linearizable reads on any peer.
//
// It owns everything Raft-shaped and nothing Kubernetes-shaped. Callers see Apply (write, from any peer),
// LinearizableRead (wait until this peer's store reflects every write acknowledged before the call), and the
// store itself for local reads and watches.
package raftnode
