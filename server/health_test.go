package server_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/skiff-dev/skiff/internal/servertest"
	"github.com/skiff-dev/skiff/server"
)

// TestHealth: three healthy servers tolerate one failure; with a follower stopped the cluster is unhealthy,
// tolerates none, and names the server that does not answer.
func TestHealth(t *testing.T) {
	peers := servertest.Start(t, 3)
	var leader, follower *servertest.Peer
	for _, p := range peers {
		if p.Server.Node().IsLeader() {
			leader = p
		} else if follower == nil {
			follower = p
		}
	}
	if leader == nil {
		t.Fatal("no leader")
	}
	client, err := rest.HTTPClientFor(leader.Config)
	if err != nil {
		t.Fatal(err)
	}
	get := func() server.Health {
		t.Helper()
		resp, err := client.Get(leader.Config.Host + "/v1/operator/health")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var h server.Health
		if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&h) != nil {
			t.Fatalf("GET /v1/operator/health: %d", resp.StatusCode)
		}
		return h
	}
	waitHealth(t, "three healthy servers", get, func(h server.Health) error {
		if !h.Healthy || h.FailureTolerance != 1 || len(h.Servers) != 3 {
			return fmt.Errorf("%+v", h)
		}
		return nil
	})
	stopped := follower.Server.Node().ID()
	follower.Server.Shutdown()
	waitHealth(t, "the stopped follower to show", get, func(h server.Health) error {
		if h.Healthy || h.FailureTolerance != 0 {
			return fmt.Errorf("healthy %v tolerance %d", h.Healthy, h.FailureTolerance)
		}
		for _, sv := range h.Servers {
			if sv.Name == stopped && !sv.Healthy && sv.Reason != "" {
				return nil
			}
		}
		return fmt.Errorf("%s not reported unhealthy: %+v", stopped, h.Servers)
	})
}

func waitHealth(t *testing.T, what string, get func() server.Health, check func(server.Health) error) {
	t.Helper()
	var err error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if err = check(get()); err == nil {
			return
		}
	}
	t.Fatalf("%s: %v", what, err)
}
