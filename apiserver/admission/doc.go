// Package admission owns Skiff's admission plugins and the chain that orders them (NewChain): Kubernetes'
// LimitRanger, ServiceAccount, NodeRestriction, PodSecurity, Priority, DefaultTolerationSeconds,
// DefaultStorageClass, StorageObjectInUseProtection, RuntimeClass and ResourceQuota, written again on v1 objects or
// adapted from the Kubernetes libraries, and the wiring of the library's webhook and ValidatingAdmissionPolicy
// plugins. The plugins see the API only as an admission.Attributes and through the server's loopback client
// and informers.
//
// It must not import package apiserver (which imports it) nor reach storage: no registry, no Raft store.
// What it needs of the server (the generic config, the loopback client, the certificate plugins, which
// convert to kube's internal types with apiserver's scheme, the webhooks' service resolver) is passed to
// NewChain.
package admission
