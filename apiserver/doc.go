// Package apiserver serves the Kubernetes API from every control-plane peer. It is built on k8s.io/apiserver,
// the library kube-apiserver is made of: discovery, content negotiation, patch, server-side apply, dry-run,
// chunking, watch and tables all come from the library.
//
// A request flows through a chain of three servers, composed as kube-apiserver composes its own (New):
//   - the aggregator (package apiserver/aggregator, k8s.io/kube-aggregator) is outermost and serves: it holds
//     the listener, answers /apis discovery for every group, serves the APIServices, and routes each group
//     version to the local servers behind it or, for an APIService backed by a Service, proxies it there;
//   - then Skiff's built-in kinds (this package), which delegate what they do not serve;
//   - then, innermost, the extensions server (package apiserver/extensions, k8s.io/apiextensions-apiserver):
//     CustomResourceDefinitions and the custom resources they define.
//
// The handler chain (the library's filters: authentication and authorization, from package apiserver/auth;
// audit, audit.go; in-flight limits and timeouts; statusbody.go's Status bodies) runs once, at the outermost
// server: each server hands requests it does not serve to its delegate's unfiltered handler. Admission is one
// chain too (package apiserver/admission, admission.NewChain), shared by the three servers through the
// generic config they copy, and run by the server that serves the resource. Each server's storage goes
// through package apiserver/raftstore, under the library's watch cache: this package and its sub-packages
// reach the Raft store only through it.
//
// This package owns what the library leaves to its user:
//   - the scheme of served types (k8s.io/api types, each also registered as its own internal version, but
//     for a kind served in two versions: autoscaling/v1 HorizontalPodAutoscalers convert to v2's type);
//   - the registry table, where each kind is described once (strategy, field selectors, table columns), with
//     the kinds' REST storages (subresources, pod streams, evictions, RBAC's escalation-checked storage, the
//     token and access reviews);
//   - the composition of the chain (server.go, chain.go) and its shared config: OpenAPI, discovery, the
//     loopback client, the certificate admission plugins handed to the admission chain;
//   - the generated OpenAPI (package openapi).
package apiserver
