// Package proxy is the node agent's iptables service proxy, in the manner of kube-proxy's iptables mode, and
// the one place in Skiff that writes iptables rules: Service ClusterIPs and NodePorts, and the pod egress
// masquerade chain.
//
// It reads Services, EndpointSlices and its own Node through client-go informers and writes the whole of
// its own chains in one `iptables-restore --noflush` transaction per sync (BuildRules turns the objects
// into that text and is a pure function). It uses github.com/coreos/go-iptables only for what a restore
// cannot do well: the jumps from the built-in chains, and version and feature detection.
//
// Every chain it makes is named after the agent's host id (SKIFF-<id>-...), so several agents sharing one
// network namespace (skiff dev, tests) never touch each other's rules, and every chain set carries an
// owner comment naming the agent's data dir. An agent holds an flock on a file in its data dir while it
// lives; an agent that starts removes the chains of owners whose lock is free (ownership.go). It never
// touches rules that are not Skiff's.
package proxy
