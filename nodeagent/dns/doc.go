// Package dns is the node agent's cluster DNS: CoreDNS embedded as a library, with only the plugins a
// node needs, answering for the kube-dns Service on the node's pod bridge gateway address.
//
// Each containerd agent runs its own CoreDNS rather than a cluster-wide Deployment, so that names keep
// resolving while a server or another node is down (the kubernetes plugin answers from its informer cache,
// the cache plugin from memory). The agent advertises its CoreDNS as one endpoint of the kube-dns Service
// (an EndpointSlice per node, see [Slice]); with internalTrafficPolicy Local the service proxy sends each
// pod's queries to its own node.
//
// CoreDNS runs in a process of its own (child.go), the agent's binary started with EnvChild set, so that it
// outlives agent restarts as the pods do; a restarted agent adopts it.
//
// What it owns: rendering and checking the Corefile, the node's DNS process (starting, adopting, stopping it)
// and CoreDNS inside it, the local TCP forwarder that gives CoreDNS's client-go failover across the servers,
// the kubeconfig CoreDNS reads, the cluster facts ConfigMap's format, and the node's kube-dns EndpointSlice
// object. It does not create network
// devices or talk to containerd: the agent (nodeagent) does that and calls in here.
//
// CoreDNS keeps process-wide state (the directive list, caddy's registries, Prometheus collectors). The
// directive list is set once, by the first [Start], and every instance in the process shares it.
package dns
