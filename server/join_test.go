package server_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/internal/join"
	"github.com/skiff-dev/skiff/internal/servertest"
)

// TestAgentJoinCredentials checks the server half of an agent's join: the join token from the HCL is the
// cluster's and is written to the data dir, the CA is served with an HMAC under it, an agent's bearer token
// authenticates as its node, a wrong token gets 401, and a node may not use the operator endpoints.
func TestAgentJoinCredentials(t *testing.T) {
	const token = "0123456789abcdef-join"
	peers := servertest.StartWith(t, 1, func(f *config.ServerFile) { f.Server.Token = ptr(token) })
	ctx := context.Background()
	dataDir := filepath.Dir(peers[0].Server.KubeconfigPath())
	written, err := os.ReadFile(filepath.Join(dataDir, "join-token"))
	for i := 0; err != nil && i < 50; i++ { // written just after the kubeconfig
		waitABit()
		written, err = os.ReadFile(filepath.Join(dataDir, "join-token"))
	}
	if err != nil || strings.TrimSpace(string(written)) != token {
		t.Fatalf("join-token file: %q, %v", written, err)
	}

	// The CA, fetched anonymously over unverified TLS, checks out against the token.
	insecure := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	resp, err := insecure.Get(peers[0].Config.Host + join.CAPath)
	if err != nil {
		t.Fatal(err)
	}
	var body join.CAResponse
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %v", join.CAPath, resp.StatusCode, err)
	}
	resp.Body.Close()
	ca, err := join.VerifyCA(token, body)
	if err != nil {
		t.Fatal(err)
	}
	if string(ca) != string(peers[0].Config.TLSClientConfig.CAData) {
		t.Fatalf("served CA differs from the admin kubeconfig's")
	}
	if _, err := join.VerifyCA("not-the-token-at-all", body); err == nil {
		t.Fatal("the CA verified under a wrong token")
	}

	agentConfig := func(bearer string) *rest.Config {
		return &rest.Config{Host: peers[0].Config.Host, BearerToken: bearer, TLSClientConfig: rest.TLSClientConfig{CAData: ca}}
	}
	agent := kubernetes.NewForConfigOrDie(agentConfig(join.BearerToken("node-1", token)))
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}
	if _, err := agent.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatalf("agent creating its Node: %v", err)
	}
	wrong := kubernetes.NewForConfigOrDie(agentConfig(join.BearerToken("node-1", "wrong-token-value")))
	if _, err := wrong.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{}); !apierrors.IsUnauthorized(err) {
		t.Fatalf("wrong join token: %v, want 401", err)
	}
	httpClient, err := rest.HTTPClientFor(agentConfig(join.BearerToken("node-1", token)))
	if err != nil {
		t.Fatal(err)
	}
	resp, err = httpClient.Get(peers[0].Config.Host + "/v1/operator/raft/peers")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a node on the operator endpoints got %d, want 403", resp.StatusCode)
	}
	// Nor may it become an administrator by impersonation.
	req, _ := http.NewRequest(http.MethodGet, peers[0].Config.Host+"/v1/operator/snapshot", nil)
	req.Header.Set("Impersonate-User", "skiff-admin")
	req.Header.Set("Impersonate-Group", "system:masters")
	resp, err = httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a node impersonating system:masters got %d, want 403", resp.StatusCode)
	}
}

// TestLeaderOnlyOperatorCallThroughAFollower: a follower forwards a leader-only operator call to the leader
// with credentials the leader accepts.
func TestLeaderOnlyOperatorCallThroughAFollower(t *testing.T) {
	peers := servertest.Start(t, 3)
	var follower *servertest.Peer
	for _, p := range peers {
		if !p.Server.Node().IsLeader() {
			follower = p
			break
		}
	}
	client, err := rest.HTTPClientFor(follower.Config)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Post(follower.Config.Host+"/v1/operator/raft/transfer-leadership", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("transfer-leadership through a follower: %d %s", resp.StatusCode, body)
	}
}

func ptr[T any](v T) *T { return &v }

func waitABit() { time.Sleep(100 * time.Millisecond) }
