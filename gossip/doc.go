// Package gossip is the memberlist pool that servers (and, later, node agents) share. It owns member
// metadata (role, name, Raft and API addresses, bootstrap_expect), joining with retry, the encryption keyring
// (a default key derived from a shared secret, the keyring file, rotation with SetKeyring, and each member's
// keyring hash in its metadata), and the table and stream of member state changes. It knows nothing about
// Raft or Kubernetes: callers read the metadata and decide.
package gossip
