// Package bench holds Skiff's benchmarks that need real parts: write throughput against a three-member etcd
// cluster from Debian's etcd-server, side by side in the same run, and leader failover time of real server
// processes. `make bench` runs them in full; `make test` runs a short smoke of each.
package bench
