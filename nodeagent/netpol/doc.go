// Package netpol enforces networking.k8s.io/v1 NetworkPolicies on the pods of one node agent, as a policy
// engine (Calico, kube-router) does, in iptables and ipset.
//
// A pod that no policy selects for a direction keeps all its traffic in that direction. For a pod a policy
// selects (isolates), the agent writes a chain that lets through what one of the selecting policies' rules
// allows and rejects the rest:
//
//	filter FORWARD (new connections): -m comment --comment <owner> -j SKIFF-NP-<id>-FWD
//	SKIFF-NP-<id>-FWD: -s <pod IP> -j SKIFF-NP-<id>-E<hash>   for each egress-isolated pod of the node
//	                   -d <pod IP> -j SKIFF-NP-<id>-I<hash>   for each ingress-isolated pod of the node
//	SKIFF-NP-<id>-I<hash>: <peer match> <port match> -j RETURN, one per allowed (peer, port), then REJECT
//
// Allowed traffic RETURNs, so that a connection between two isolated pods of the node passes the sender's
// egress chain and then the receiver's ingress chain, and the rest of FORWARD (other agents' chains on a
// shared host) still applies. Only new connections are judged: replies to an allowed connection, and
// connections that were established before a policy changed, pass by conntrack, as with every engine.
//
// Peers that are pods go in ipsets, named after their contents (SKIFF-NP-<id>-<hash>, so that every rule
// with the same peers shares one set): hash:ip for pod selectors, hash:net for an ipBlock (its excepts are
// nomatch entries), hash:ip,port for named ports of egress rules, which resolve on each destination pod.
// Traffic is judged after a Service's DNAT (FORWARD comes after nat PREROUTING), so policies see the pod a
// Service chose. The node's own traffic to its pods leaves through OUTPUT and is never judged (probes pass),
// nor is a pod's traffic to its own node (INPUT), as in Kubernetes.
//
// The chains and sets outlive the agent, as pods do: a restarted agent leaves the previous run's rules in
// force until its informers have synced and it has written the new ones in one restore. `skiff agent
// -teardown` removes them (RemoveAll), and so does an agent that finds their owner dead (proxy.RemoveStale
// for the chains, RemoveSets for the sets).
package netpol
