package nodeagent

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/gossip"
	"github.com/skiff-dev/skiff/internal/freeport"
	"github.com/skiff-dev/skiff/internal/servertest"
	"github.com/skiff-dev/skiff/server"
)

// TestAgentFollowsGossipKeyring: an agent without `encrypt` joins the servers' pool with the key derived
// from its join token, then follows a rotation done through the operator endpoints (install, use, remove),
// keeping its keyring file, and stays in the pool under the new key only.
func TestAgentFollowsGossipKeyring(t *testing.T) {
	token := "0123456789-gossip-keyring"
	peer := servertest.StartWith(t, 1, func(f *config.ServerFile) { f.Server.Token = &token })[0]
	self, ok := peer.Server.Pool().Member("cp-0")
	if !ok {
		t.Fatal("the server is not in its own member table")
	}
	u, err := url.Parse(peer.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	logger := hclog.New(&hclog.LoggerOptions{Name: "agent", Level: hclog.Info, Output: testWriter{t}})
	cfg := &config.Agent{Name: "n1", DataDir: t.TempDir(), Token: token, BindAddr: "127.0.0.1", AdvertiseAddr: "127.0.0.1",
		GossipPort: freeport.One(t), RetryJoin: []string{self.Addr}, RetryInterval: 100 * time.Millisecond, RetryMax: 50}
	a := &Agent{cfg: cfg, logger: logger}
	if a.pool, err = a.joinPool(ctx); err != nil {
		t.Fatalf("joining with the key derived from the join token: %v", err)
	}
	defer a.pool.Shutdown()
	access, err := nodeAccess(ctx, cfg, "n1", func() []string { return []string{u.Host} }, logger)
	if err != nil {
		t.Fatal(err)
	}
	a.client = kubernetes.NewForConfigOrDie(access.config)
	stop := a.followGossipKeyring(ctx, 100*time.Millisecond)
	defer stop()

	admin, err := rest.HTTPClientFor(peer.Config)
	if err != nil {
		t.Fatal(err)
	}
	change := func(op, key string) {
		t.Helper()
		body, _ := json.Marshal(server.GossipKeyRequest{Key: key})
		resp, err := admin.Post(peer.Config.Host+"/v1/operator/gossip/keyring/"+op, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: HTTP %d", op, resp.StatusCode)
		}
	}
	waitKeyring := func(step string, want gossip.Keyring) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			got, err := a.pool.Keyring()
			m, _ := peer.Server.Pool().Member("n1")
			if err == nil && got.Hash() == want.Hash() && m.Status == gossip.StatusAlive && m.Meta.KeyringHash == want.Hash() {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the agent has %+v (%v); the server sees it as %+v", step, got, err, m)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	old := gossip.EncodeKey(gossip.KeyFromSecret(token))
	next := gossip.EncodeKey(bytes.Repeat([]byte{9}, 32))
	change("install", next)
	waitKeyring("install", gossip.Keyring{Primary: old, Keys: []string{old, next}})
	change("use", next)
	waitKeyring("use", gossip.Keyring{Primary: next, Keys: []string{old, next}})
	change("remove", old)
	final := gossip.Keyring{Primary: next, Keys: []string{next}}
	waitKeyring("remove", final)
	ring, found, err := gossip.ReadKeyringFile(filepath.Join(cfg.DataDir, gossip.KeyringFileName))
	if err != nil || !found || ring.Hash() != final.Hash() {
		t.Fatalf("the agent's keyring file: %+v, %v, %v", ring, found, err)
	}
	// Still gossiping: a metadata change reaches the server.
	if err := a.pool.UpdateMeta(gossip.Meta{Role: gossip.RoleAgent, Nodes: []string{"n1", "n1-extra"}}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for m, _ := peer.Server.Pool().Member("n1"); len(m.Meta.Nodes) != 2; m, _ = peer.Server.Pool().Member("n1") {
		if time.Now().After(deadline) {
			t.Fatalf("the agent's metadata change did not reach the server: %+v", m)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
