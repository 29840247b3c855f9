package server_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	certutil "k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/certificate/csr"

	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/internal/join"
	"github.com/skiff-dev/skiff/internal/servertest"
	"github.com/skiff-dev/skiff/server"
)

// TestAgentJoinCredentials checks the server half of an agent's join: the join token from the HCL is the
// cluster's and is written to the data dir, the CA is served with an HMAC under it, an agent's bearer token
// makes it a bootstrapper that gets its node's client certificate through the CSR API (and may do nothing
// else), a wrong token gets 401, and a node may not use the operator endpoints.
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
	// The file carries the CA's hash before the secret, in k3s's form.
	if err != nil || !strings.HasPrefix(string(written), "K10") || !strings.HasSuffix(strings.TrimSpace(string(written)), "::"+token) {
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
	if tok, err := join.ParseToken(strings.TrimSpace(string(written))); err != nil {
		t.Fatal(err)
	} else if _, err := tok.Verify(body); err != nil {
		t.Fatalf("the written token does not verify the served CA: %v", err)
	}
	if _, err := join.VerifyCA("not-the-token-at-all", body); err == nil {
		t.Fatal("the CA verified under a wrong token")
	}

	agentConfig := func(bearer string) *rest.Config {
		return &rest.Config{Host: peers[0].Config.Host, BearerToken: bearer, TLSClientConfig: rest.TLSClientConfig{CAData: ca}}
	}
	// The join token makes a bootstrapper, which may not act as its node...
	bootstrapper := kubernetes.NewForConfigOrDie(agentConfig(join.BearerToken("node-1", token)))
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}}
	if _, err := bootstrapper.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("a bootstrapper creating a Node: %v, want 403", err)
	}
	wrong := kubernetes.NewForConfigOrDie(agentConfig(join.BearerToken("node-1", "wrong-token-value")))
	if _, err := wrong.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{}); !apierrors.IsUnauthorized(err) {
		t.Fatalf("wrong join token: %v, want 401", err)
	}
	// ...but may ask for the node's client certificate, which the leader approves and signs (TLS bootstrap).
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	csrPEM, err := certutil.MakeCSR(key, &pkix.Name{CommonName: "system:node:node-1", Organization: []string{"system:nodes"}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	usages := []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}
	name, uid, err := csr.RequestCertificate(bootstrapper, csrPEM, "", certificatesv1.KubeAPIServerClientKubeletSignerName, nil, usages, key)
	if err != nil {
		t.Fatalf("a bootstrapper asking for a node certificate: %v", err)
	}
	// It may not approve a request itself.
	pending, err := bootstrapper.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pending.Status.Conditions = append(pending.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue})
	if _, err := bootstrapper.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, name, pending, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) && !apierrors.IsConflict(err) {
		t.Fatalf("a bootstrapper approving its own request: %v, want 403", err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	certPEM, err := csr.WaitForCertificate(waitCtx, bootstrapper, name, uid)
	if err != nil {
		t.Fatalf("waiting for the node certificate: %v", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	nodeConfig := &rest.Config{Host: peers[0].Config.Host, TLSClientConfig: rest.TLSClientConfig{CAData: ca, CertData: certPEM,
		KeyData: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})}}
	agent := kubernetes.NewForConfigOrDie(nodeConfig)
	if _, err := agent.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the node creating its Node with its certificate: %v", err)
	}
	httpClient, err := rest.HTTPClientFor(nodeConfig)
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

	// Rotating the join token revokes the old one: a new bootstrapper presenting it gets 401 (so no
	// certificate), the new token works, the node keeps its certificate, and the file follows.
	admin, err := rest.HTTPClientFor(peers[0].Config)
	if err != nil {
		t.Fatal(err)
	}
	rotate := func(body string) (int, string) {
		resp, err := admin.Post(peers[0].Config.Host+"/v1/operator/join-token/rotate", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := rotate(`{"token":"short"}`); code != http.StatusBadRequest || !strings.Contains(body, "at least 16 characters") {
		t.Fatalf("rotating to a short token: %d %s, want 400", code, body)
	}
	code, answer := rotate("")
	var rotated server.JoinTokenRotation
	if code != http.StatusOK || json.Unmarshal([]byte(answer), &rotated) != nil {
		t.Fatalf("rotating the join token: %d %s", code, answer)
	}
	newToken, err := join.ParseToken(rotated.Token)
	if err != nil || newToken.Secret == token || newToken.CheckCA(ca) != nil {
		t.Fatalf("rotated token %q: %v", rotated.Token, err)
	}
	revoked := kubernetes.NewForConfigOrDie(agentConfig(join.BearerToken("node-2", token)))
	if _, err := revoked.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{}); !apierrors.IsUnauthorized(err) {
		t.Fatalf("the revoked join token: %v, want 401", err)
	}
	renewed := kubernetes.NewForConfigOrDie(agentConfig(join.BearerToken("node-2", rotated.Token)))
	if _, err := renewed.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("the new join token: %v", err)
	}
	if _, err := agent.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{}); err != nil {
		t.Fatalf("the node with its certificate after the rotation: %v", err)
	}
	for i := 0; ; i++ {
		written, _ = os.ReadFile(filepath.Join(dataDir, "join-token"))
		if strings.TrimSpace(string(written)) == rotated.Token {
			break
		}
		if i == 50 {
			t.Fatalf("join-token file after the rotation: %q, want %q", written, rotated.Token)
		}
		waitABit()
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
