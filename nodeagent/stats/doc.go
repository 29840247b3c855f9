// Package stats measures the CPU and memory use of the node and of its containers, and serves the figures as
// the kubelet's resource metrics endpoint (/metrics/resource) does, so that the servers can answer the
// metrics.k8s.io API (kubectl top) without a metrics-server.
//
// It owns the reading of cgroup (v1 and v2) and procfs files and the Prometheus text it writes. It only
// reads: it never writes a cgroup file, and it does not know which containers run; the agent hands it the
// list on each scrape.
package stats
