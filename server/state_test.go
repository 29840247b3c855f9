package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/internal/join"
	"github.com/skiff-dev/skiff/internal/servertest"
	rt "github.com/skiff-dev/skiff/raftnode/raftnodetest"
	"github.com/skiff-dev/skiff/server"
)

// TestRaftStateConverges: after writes through every server, the servers report the same applied index and
// state hash; whenever two of them report the same index on the way, their hashes agree. The endpoint is for
// administrators only, and the Go runtime's metrics are on /metrics.
func TestRaftStateConverges(t *testing.T) {
	const token = "0123456789abcdef-state"
	peers := servertest.StartWith(t, 3, func(f *config.ServerFile) { f.Server.Token = ptr(token) })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	clients := make([]*http.Client, len(peers))
	for i, p := range peers {
		c, err := rest.HTTPClientFor(p.Config)
		if err != nil {
			t.Fatal(err)
		}
		clients[i] = c
	}
	state := func(i int) (server.RaftState, error) {
		var st server.RaftState
		resp, err := clients[i].Get(peers[i].Config.Host + "/v1/operator/raft/state")
		if err != nil {
			return st, err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return st, fmt.Errorf("cp-%d: HTTP %d %s", i, resp.StatusCode, body)
		}
		return st, json.Unmarshal(body, &st)
	}

	// Writes through every server: the followers' are forwarded to the leader. A write whose outcome is unknown
	// (a leader change on a loaded machine, with the fast test timeouts) is retried as a client must: it may
	// have committed, so a retried create may find the object and a retried delete may not.
	write := func(what string, f func() error, done func(error) bool) {
		t.Helper()
		for attempt := 0; ; attempt++ {
			err := f()
			if err == nil || attempt > 0 && done(err) {
				return
			}
			if attempt == 10 || !apierrors.IsTimeout(err) && !apierrors.IsServerTimeout(err) && !apierrors.IsTooManyRequests(err) {
				t.Fatalf("%s: %v", what, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	for i := 0; i < 30; i++ {
		p := peers[i%len(peers)]
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("state-%d", i)}, Data: map[string]string{"i": fmt.Sprint(i)}}
		write("creating "+cm.Name, func() error {
			_, err := p.Client.CoreV1().ConfigMaps("default").Create(ctx, cm, metav1.CreateOptions{})
			return err
		}, apierrors.IsAlreadyExists)
		if i%3 == 0 {
			write("deleting "+cm.Name, func() error {
				return p.Client.CoreV1().ConfigMaps("default").Delete(ctx, cm.Name, metav1.DeleteOptions{})
			}, apierrors.IsNotFound)
		}
	}

	// The servers keep writing on their own (the leader's Lease, events), so wait for a quiet moment in which
	// all three agree.
	hashAt := map[uint64]string{}
	var agreed server.RaftState
	rt.WaitFor(t, "the servers to agree on applied index and state hash", 30*time.Second, func() error {
		var states []server.RaftState
		for i := range peers {
			st, err := state(i)
			if err != nil {
				return err
			}
			if want := fmt.Sprintf("cp-%d", i); st.Name != want || st.Goroutines <= 0 || len(st.StateHash) != 64 {
				t.Fatalf("%s answered %+v", want, st)
			}
			if h, ok := hashAt[st.AppliedIndex]; ok && h != st.StateHash {
				t.Fatalf("%s hashes %s at index %d, another server hashed %s at that index", st.Name, st.StateHash, st.AppliedIndex, h)
			}
			hashAt[st.AppliedIndex] = st.StateHash
			states = append(states, st)
		}
		for _, st := range states[1:] {
			if st.AppliedIndex != states[0].AppliedIndex || st.StateHash != states[0].StateHash {
				return fmt.Errorf("not converged: %+v", states)
			}
		}
		agreed = states[0]
		return nil
	})
	t.Logf("converged at index %d, state %s; %d indexes seen", agreed.AppliedIndex, agreed.StateHash, len(hashAt))

	// A node agent is an authenticated user, but not an administrator.
	agent, err := rest.HTTPClientFor(&rest.Config{Host: peers[0].Config.Host, BearerToken: join.BearerToken("node-1", token),
		TLSClientConfig: rest.TLSClientConfig{CAData: peers[0].Config.TLSClientConfig.CAData}})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := agent.Get(peers[0].Config.Host + "/v1/operator/raft/state")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a node on /v1/operator/raft/state got %d, want 403", resp.StatusCode)
	}

	// The Go runtime collector, registered by the API library's legacy registry, is served on /metrics.
	resp, err = clients[0].Get(peers[0].Config.Host + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "\ngo_goroutines ") {
		t.Fatalf("/metrics: HTTP %d, go_goroutines present: %v", resp.StatusCode, strings.Contains(string(body), "go_goroutines"))
	}
}
