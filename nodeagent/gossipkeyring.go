package nodeagent

import (
	"context"
	"encoding/json"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/skiff-dev/skiff/gossip"
	"github.com/skiff-dev/skiff/internal/join"
)

// keyringPollInterval is how often an agent asks the servers for the cluster's gossip keyring.
const keyringPollInterval = 10 * time.Second

// followGossipKeyring keeps the pool's keyring equal to the cluster's, which the servers serve to nodes at
// join.GossipKeyringPath, asking every interval in the background; the function it returns stops that and
// waits. The pool installs new keys before it switches the primary and removes old keys last, and rewrites
// its keyring file, so a restart keeps the rotated keys. An identity that is not a node (a simulated agent's
// kubeconfig user) is refused: the agent then keeps its keyring. Without a pool there is nothing to follow.
func (a *Agent) followGossipKeyring(ctx context.Context, every time.Duration) (stop func()) {
	if a.pool == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.pollGossipKeyring(ctx, every)
	}()
	return func() {
		cancel()
		<-done
	}
}

func (a *Agent) pollGossipKeyring(ctx context.Context, every time.Duration) {
	rest := a.client.Discovery().RESTClient()
	var lastErr string
	for {
		body, err := rest.Get().AbsPath(join.GossipKeyringPath).DoRaw(ctx)
		if apierrors.IsForbidden(err) {
			a.logger.Warn("the servers do not serve the gossip keyring to this agent's identity, which is not a node: "+
				"gossip key rotations will not reach it", "error", err)
			return
		}
		if err == nil {
			var ring gossip.Keyring
			if err = json.Unmarshal(body, &ring); err == nil {
				_, err = a.pool.SetKeyring(ring)
			}
		}
		msg := ""
		if err != nil && ctx.Err() == nil {
			if msg = err.Error(); msg != lastErr {
				a.logger.Warn("following the cluster's gossip keyring", "error", err)
			}
		}
		lastErr = msg
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}
