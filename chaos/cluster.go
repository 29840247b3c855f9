package chaos

import (
	"context"
	"math/rand/v2"

	"github.com/skiff-dev/skiff/localcluster"
)

// Cluster is the system under test.
type Cluster struct {
	// Kubeconfig has a context per server (localcluster.ClusterKubeconfig for a local cluster); the traffic
	// uses every context at once.
	Kubeconfig string
	// Local is set when the suite made the cluster itself and may break it: faults need it.
	Local *Local
}

// Local is a `skiff local` cluster the suite controls.
type Local struct {
	Dir   string // the cluster's directory (localcluster's --dir)
	Bin   string // the skiff binary
	State *localcluster.State
}

// Fault is one kind of failure the injector causes.
type Fault struct {
	Name string
	// Alone marks a fault that needs a working cluster to inject (a leader to find, a server to restart, a
	// namespace to write) or takes it all down: it is never combined with another in a round.
	Alone bool
	// Inject causes the fault, making its random choices with rng so that a seed replays a round, and returns
	// how to heal it. logf records what it did for the round's report.
	Inject func(ctx context.Context, c *Local, rng *rand.Rand, logf func(format string, args ...any)) (heal func(context.Context) error, err error)
}
