// Package chaos is Skiff's process-level chaos and consistency suite: it runs Kubernetes-style traffic against
// every server of a real cluster (`skiff local`: servers and agents in network namespaces, real containerd),
// injects faults (kills, pauses, partitions, delay and loss, interrupted leadership transfers, snapshot
// installs, full-cluster crashes, a full disk), and checks the histories it recorded: linearizability of
// every key (porcupine), no lost acknowledged write, watch guarantees, list freshness, replica convergence,
// liveness and that no pod runs twice. `make chaos` runs many rounds; `make test` a smoke of three. Pointed at
// an existing cluster (a kubeconfig with a context per server), it runs the traffic and checks without faults.
package chaos
