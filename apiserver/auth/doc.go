// Package auth owns who a request is and what it may do: authentication (client certificates of the cluster
// CA, the admin token, node agents' join tokens, service account tokens, anonymous access to the public
// paths), the service account tokens themselves (signing and validation, the TokenRequest storage),
// authorization (the public paths, system:masters, Kubernetes' Node and RBAC authorizers) and the bootstrap
// RBAC policy reconciled when a server starts.
//
// It must not import package apiserver (which imports it) nor its registry: the stores service account
// tokens look objects up in are handed to it (ServiceAccountTokens.SetStore), and the RBAC kinds' validation
// and escalation-checked storage, which are registry (as kube's pkg/registry/rbac), stay in apiserver, as do
// the TokenReview and access review storages (authzreviews.go).
package auth
