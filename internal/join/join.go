// Package join holds what servers and node agents must agree on for an agent to join: the bearer token an
// agent presents, and how an agent that has only the join token checks the cluster CA it is handed.
//
// An agent authenticates as "node:<node name>:<join token>", which the API maps to the user
// system:node:<node name> in the group system:nodes. Before it trusts any server, an agent without a CA file
// fetches the CA from CAPath over unverified TLS, together with an HMAC-SHA256 of the CA certificate keyed
// by the join token. Only someone who knows the token can produce that HMAC, so a man in the middle cannot
// hand the agent a CA of its own.
package join

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
)

// ServerCAPath is where every server serves CAResponse to anyone, with the HMAC keyed by the cluster token's
// secret: the first step of a server joining (see package server). ServerJoinPath is the second, a POST that
// presents the secret.
const (
	ServerCAPath   = "/v1/server/ca"
	ServerJoinPath = "/v1/server/join"
)

// CAPath is where every server serves CAResponse, to anyone.
const CAPath = "/v1/agent/ca"

// CAResponse is the body at CAPath.
type CAResponse struct {
	// CA is the cluster CA certificate, PEM.
	CA string `json:"ca"`
	// HMAC is hex(HMAC-SHA256(key: join token, message: CA)).
	HMAC string `json:"hmac"`
}

const bearerPrefix = "node:"

// BearerToken is the token an agent presents for a node.
func BearerToken(node, token string) string { return bearerPrefix + node + ":" + token }

// ParseBearerToken splits an agent's bearer token; ok is false for any other token.
func ParseBearerToken(bearer string) (node, token string, ok bool) {
	rest, ok := strings.CutPrefix(bearer, bearerPrefix)
	if !ok {
		return "", "", false
	}
	// Node names are DNS subdomains and never contain ':'; tokens may.
	node, token, ok = strings.Cut(rest, ":")
	if !ok || node == "" || token == "" {
		return "", "", false
	}
	return node, token, true
}

// CAHMAC authenticates a CA certificate with the join token.
func CAHMAC(token string, caPEM []byte) string {
	mac := hmac.New(sha256.New, []byte(token))
	mac.Write(caPEM)
	return hex.EncodeToString(mac.Sum(nil))
}

// ErrCAMismatch means the CA offered does not match the join token: a wrong token, or someone else's CA.
var ErrCAMismatch = errors.New("the cluster CA offered by the server does not match the join token: the token is wrong, or the server is not the cluster's")

// VerifyCA checks a CAResponse against the join token and returns the CA PEM.
func VerifyCA(token string, resp CAResponse) ([]byte, error) {
	want, err := hex.DecodeString(CAHMAC(token, []byte(resp.CA)))
	if err != nil {
		return nil, err
	}
	got, err := hex.DecodeString(resp.HMAC)
	if err != nil || !hmac.Equal(got, want) {
		return nil, ErrCAMismatch
	}
	return []byte(resp.CA), nil
}

// ServingCertPath is where an agent, authenticated as its node, sends a PEM certificate request (PKCS#10) for
// the serving certificate of its HTTPS endpoint and gets back the PEM certificate, then the CA's. The request
// names system:node:<node> in system:nodes and only the node's name and addresses.
const ServingCertPath = "/v1/agent/serving-certificate"

// GossipKeyringPath is where an agent, authenticated as a node, reads the cluster's gossip keyring (JSON,
// gossip.Keyring) to follow key rotations.
const GossipKeyringPath = "/v1/agent/gossip-keyring"

// AgentClientCN is the common name of the client certificate the servers present to agents, the only
// identity an agent's endpoint serves (kube-apiserver's kubelet client, as kubeadm names it).
const AgentClientCN = "kube-apiserver-kubelet-client"
