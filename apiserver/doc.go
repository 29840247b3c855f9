// Package apiserver serves the Kubernetes API from every control-plane peer. It is built on k8s.io/apiserver,
// the library kube-apiserver is made of: discovery, content negotiation, patch, server-side apply, dry-run,
// chunking, watch and tables all come from the library. This package owns what the library leaves to its
// user:
//   - the scheme of served types (k8s.io/api types, each also registered as its own internal version);
//   - the registry table, where each kind is described once (strategy, field selectors, table columns);
//   - storage: raftstore under the library's watch cache;
//   - authentication of the admin token, authorization, and admission wiring;
//   - the generated OpenAPI (package openapi).
//
// It reaches the Raft store only through raftstore.
package apiserver
