// Package server assembles one control-plane peer: the Raft node and its store, the gossip member, bootstrap
// by bootstrap_expect, the leader-only services (adding joined servers as voters, the admin token), and the
// HTTP endpoints on the API port (health, metrics, operator). cmd/skiff calls it; later issues mount the
// Kubernetes API beside these endpoints.
package server
