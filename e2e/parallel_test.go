package e2e

import (
	"testing"

	"github.com/skiff-dev/skiff/internal/hostnetlock"
)

// The e2e tests run side by side (`go test -parallel`): each has its own processes, data directories and
// ports (internal/freeport claims them across processes), and `skiff local` puts each cluster's hosts in
// network namespaces of their own on a bridge with a free subnet. Most of a test's time is spent waiting (an
// election, a pod starting, a failover), so running them together divides the suite's wall time without
// changing what any test checks.
//
// The tests whose real agents run in this machine's own network namespace take turns, with each other and with
// the benchmark smoke's real agent (another process, beside them in `make test`): they share the agent
// endpoint's port (10250), the default pod CIDR and the host's iptables, which TestLocalServices counts before
// and after (internal/hostnetlock).

// parallel marks a test that shares nothing with the others.
func parallel(t *testing.T) {
	t.Parallel()
}

// parallelOnHostNetwork marks a test that uses this machine's own network namespace: it runs beside the
// others but never beside another such test. The lock is released after every cleanup the test registers
// later (cleanups run last in, first out), so an agent's teardown finishes before the next test starts one.
func parallelOnHostNetwork(t *testing.T) {
	t.Parallel()
	hostnetlock.Lock(t)
}
