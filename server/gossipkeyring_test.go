package server_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/gossip"
	"github.com/skiff-dev/skiff/internal/join"
	"github.com/skiff-dev/skiff/internal/servertest"
	rt "github.com/skiff-dev/skiff/raftnode/raftnodetest"
	"github.com/skiff-dev/skiff/server"
)

// TestGossipKeyRotation: three servers start with the key derived from the cluster token; a new key is
// installed, made primary and the old one removed through one server's operator endpoints, and every
// server's keyring (and keyring file) follows while the pool stays whole. A bad key gets 400 and the primary
// key cannot be removed. The agents' endpoint serves the keyring to nodes only.
func TestGossipKeyRotation(t *testing.T) {
	const token = "0123456789abcdef-gossip-keys"
	peers := servertest.StartWith(t, 3, func(f *config.ServerFile) { f.Server.Token = ptr(token) })
	admin, err := rest.HTTPClientFor(peers[1].Config)
	if err != nil {
		t.Fatal(err)
	}
	call := func(method, path string, body any, out any) int {
		t.Helper()
		var in io.Reader
		if body != nil {
			b, _ := json.Marshal(body)
			in = bytes.NewReader(b)
		}
		req, err := http.NewRequest(method, peers[1].Config.Host+path, in)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := admin.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		if resp.StatusCode == http.StatusOK && out != nil {
			if err := json.Unmarshal(data, out); err != nil {
				t.Fatalf("%s %s: %v: %s", method, path, err, data)
			}
		}
		t.Logf("%s %s: HTTP %d %s", method, path, resp.StatusCode, strings.TrimSpace(string(data)))
		return resp.StatusCode
	}
	// every waits until each server's own keyring is want, the servers all see it applied, and the pool is
	// whole. A minute, not seconds: under the race detector on a loaded two-core CI machine a starved server
	// can be declared dead by gossip (a 1 s refute window) and rejoins only at the pool's next reconnect, and
	// a keyring hash that missed its broadcast spreads with the next push-pull sync.
	every := func(step string, want gossip.Keyring) {
		t.Helper()
		rt.WaitFor(t, step+": every server on the keyring", time.Minute, func() error {
			for _, p := range peers {
				got, err := p.Server.Pool().Keyring()
				if err != nil {
					return err
				}
				if got.Hash() != want.Hash() {
					return fmt.Errorf("a server has %+v", got)
				}
				if n := len(p.Server.Pool().Alive(gossip.RoleServer)); n != 3 {
					return fmt.Errorf("a server sees %d alive servers", n)
				}
			}
			var list server.GossipKeyring
			if code := call("GET", "/v1/operator/gossip/keyring", nil, &list); code != http.StatusOK {
				return fmt.Errorf("list: HTTP %d", code)
			}
			if list.Hash != want.Hash() || list.Servers.Alive != 3 || list.Servers.Applied != 3 {
				return fmt.Errorf("list: %+v", list)
			}
			return nil
		})
	}

	derived := gossip.EncodeKey(gossip.KeyFromSecret(token))
	every("at start", gossip.Keyring{Primary: derived, Keys: []string{derived}})

	for _, bad := range []string{"not base64!", "c2hvcnQ=", gossip.EncodeKey(make([]byte, 20))} {
		if code := call("POST", "/v1/operator/gossip/keyring/install", server.GossipKeyRequest{Key: bad}, nil); code != http.StatusBadRequest {
			t.Fatalf("installing the bad key %q: HTTP %d, want 400", bad, code)
		}
	}
	next := gossip.EncodeKey(bytes.Repeat([]byte{42}, 32))
	if code := call("POST", "/v1/operator/gossip/keyring/use", server.GossipKeyRequest{Key: next}, nil); code != http.StatusBadRequest {
		t.Fatalf("using a key not installed: HTTP %d, want 400", code)
	}

	var change server.GossipKeyringChange
	if code := call("POST", "/v1/operator/gossip/keyring/install", server.GossipKeyRequest{Key: next}, &change); code != http.StatusOK || !change.Changed {
		t.Fatalf("install: HTTP %d, %+v", code, change)
	}
	every("install", gossip.Keyring{Primary: derived, Keys: []string{derived, next}})
	if code := call("POST", "/v1/operator/gossip/keyring/install", server.GossipKeyRequest{Key: next}, &change); code != http.StatusOK || change.Changed {
		t.Fatalf("installing again: HTTP %d, %+v; want no change", code, change)
	}

	if code := call("POST", "/v1/operator/gossip/keyring/use", server.GossipKeyRequest{Key: next}, &change); code != http.StatusOK || !change.Changed {
		t.Fatalf("use: HTTP %d, %+v", code, change)
	}
	every("use", gossip.Keyring{Primary: next, Keys: []string{derived, next}})

	if code := call("POST", "/v1/operator/gossip/keyring/remove", server.GossipKeyRequest{Key: next}, nil); code != http.StatusBadRequest {
		t.Fatalf("removing the primary key: HTTP %d, want 400", code)
	}
	if code := call("POST", "/v1/operator/gossip/keyring/remove", server.GossipKeyRequest{Key: derived}, &change); code != http.StatusOK || !change.Changed {
		t.Fatalf("remove: HTTP %d, %+v", code, change)
	}
	final := gossip.Keyring{Primary: next, Keys: []string{next}}
	every("remove", final)
	for _, p := range peers {
		path := filepath.Join(filepath.Dir(p.Server.KubeconfigPath()), gossip.KeyringFileName)
		if ring, ok, err := gossip.ReadKeyringFile(path); err != nil || !ok || ring.Hash() != final.Hash() {
			t.Fatalf("%s: %+v, %v, %v", path, ring, ok, err)
		}
	}

	// The agents' endpoint: the admin is not a node; a bootstrapping agent is not one yet; a node is.
	agentGet := func(cfg *rest.Config) (int, gossip.Keyring) {
		t.Helper()
		hc, err := rest.HTTPClientFor(cfg)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := hc.Get(peers[0].Config.Host + join.GossipKeyringPath)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var ring gossip.Keyring
		if resp.StatusCode == http.StatusOK {
			if err := json.NewDecoder(resp.Body).Decode(&ring); err != nil {
				t.Fatal(err)
			}
		}
		return resp.StatusCode, ring
	}
	tlsCA := rest.TLSClientConfig{CAData: peers[0].Config.TLSClientConfig.CAData}
	if code, _ := agentGet(peers[0].Config); code != http.StatusForbidden {
		t.Fatalf("the admin on the agents' keyring: HTTP %d, want 403", code)
	}
	if code, _ := agentGet(&rest.Config{Host: peers[0].Config.Host, BearerToken: join.BearerToken("node-x", token), TLSClientConfig: tlsCA}); code != http.StatusForbidden {
		t.Fatalf("a bootstrap token on the agents' keyring: HTTP %d, want 403", code)
	}
	nodePEM := servertest.NodeClientCert(t, peers[0], "node-x")
	nodeTLS := tlsCA
	nodeTLS.CertFile, nodeTLS.KeyFile = nodePEM, nodePEM
	code, ring := agentGet(&rest.Config{Host: peers[0].Config.Host, TLSClientConfig: nodeTLS})
	if code != http.StatusOK || ring.Primary != next || !slices.Equal(ring.Keys, []string{next}) {
		t.Fatalf("a node on the agents' keyring: HTTP %d, %+v", code, ring)
	}
}
