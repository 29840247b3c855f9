package nodeagent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/gossip"
	"github.com/skiff-dev/skiff/internal/version"
)

// joinPool joins the servers' gossip pool, when retry_join is set. Gossip is the agent's heartbeat: the leader
// judges the agent's Nodes by its member state, so the agent writes no heartbeats. The member's metadata
// names the Nodes it hosts; from the pool the agent learns every server's API address.
func (a *Agent) joinPool(ctx context.Context) (*gossip.Pool, error) {
	boot := make([]byte, 8)
	_, _ = rand.Read(boot)
	meta := gossip.Meta{Role: gossip.RoleAgent, BootID: hex.EncodeToString(boot), Version: version.Version}
	if names := a.nodeNames(); len(names) == 1 {
		meta.Nodes = names
	} else {
		meta.NodePrefix, meta.NodeCount = a.cfg.Name, len(names)
	}
	// The members seen are remembered under the data dir, so a restart can rejoin through any of them.
	var peersFile, keyringFile string
	if a.cfg.DataDir != "" {
		peersFile = filepath.Join(a.cfg.DataDir, "gossip-peers.json")
		keyringFile = filepath.Join(a.cfg.DataDir, gossip.KeyringFileName)
	}
	// Without `encrypt` the key is derived from the join token, as the servers derive it from the cluster
	// token (by default the same secret); once keys were rotated, the keyring file holds them.
	pool, err := gossip.New(gossip.Config{
		Name: a.cfg.Name, BindAddr: a.cfg.BindAddr, BindPort: a.cfg.GossipPort, AdvertiseAddr: a.cfg.AdvertiseAddr,
		Meta: meta, RetryJoin: a.cfg.RetryJoin, RetryInterval: a.cfg.RetryInterval, RetryMax: a.cfg.RetryMax,
		EncryptKey: a.cfg.Encrypt, DefaultKey: gossip.KeyFromSecret(joinSecret(a.cfg)), KeyringFile: keyringFile,
		PeersFile: peersFile, Logger: a.logger,
	})
	if err != nil {
		return nil, err
	}
	a.logger.Info("joining the gossip pool", "retry_join", a.cfg.RetryJoin)
	select {
	case <-pool.Joined():
	case <-pool.JoinFailed():
		pool.Shutdown()
		return nil, fmt.Errorf("could not join the gossip pool at %v after %d attempts", a.cfg.RetryJoin, a.cfg.RetryMax)
	case <-ctx.Done():
		pool.Shutdown()
		return nil, ctx.Err()
	}
	return pool, nil
}

// serverAddrs returns the API addresses to try: the configured servers, then those the pool announces.
func (a *Agent) serverAddrs() []string {
	addrs := append([]string(nil), a.cfg.Servers...)
	if a.pool == nil {
		return addrs
	}
	var announced []string
	for _, m := range a.pool.Alive(gossip.RoleServer) {
		if m.Meta.APIAddr != "" {
			announced = append(announced, m.Meta.APIAddr)
		}
	}
	// With no server alive in gossip the API may still answer, and it is the only way back: keep trying the
	// servers last announced rather than none.
	a.announcedMu.Lock()
	if len(announced) > 0 {
		a.announced = announced
	} else {
		announced = a.announced
	}
	a.announcedMu.Unlock()
	for _, s := range announced {
		if !slices.Contains(addrs, s) {
			addrs = append(addrs, s)
		}
	}
	return addrs
}

// waitForServers waits until the pool has announced at least one server's API address.
func (a *Agent) waitForServers(ctx context.Context) error {
	for len(a.serverAddrs()) == 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	return nil
}

// Node leases, as the kubelet keeps them: an agent that gossips needs none; one that does not renews a Lease
// per Node in kube-node-lease, by which the leader judges it.
const (
	leaseDuration = 40 * time.Second
	leaseRenew    = 10 * time.Second
)

func (a *Agent) renewLeases(ctx context.Context) {
	for {
		for name := range a.nodes {
			if err := a.renewLease(ctx, name); err != nil && ctx.Err() == nil {
				a.logger.Warn("renewing the node lease", "node", name, "error", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(leaseRenew):
		}
	}
}

func (a *Agent) renewLease(ctx context.Context, node string) error {
	leases := a.client.CoordinationV1().Leases(corev1.NamespaceNodeLease)
	now := metav1.NewMicroTime(time.Now())
	seconds := int32(leaseDuration / time.Second)
	lease, err := leases.Get(ctx, node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: node, Namespace: corev1.NamespaceNodeLease},
			Spec:       coordinationv1.LeaseSpec{HolderIdentity: &node, LeaseDurationSeconds: &seconds, RenewTime: &now},
		}, metav1.CreateOptions{})
		return err
	} else if err != nil {
		return err
	}
	lease.Spec.HolderIdentity, lease.Spec.LeaseDurationSeconds, lease.Spec.RenewTime = &node, &seconds, &now
	_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
	return err
}

// gossipAddr is the agent's gossip listener, for logs.
func gossipAddr(cfg *config.Agent) string {
	return net.JoinHostPort(cfg.AdvertiseAddr, strconv.Itoa(cfg.GossipPort))
}
