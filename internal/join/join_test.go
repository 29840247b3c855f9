package join

import (
	"errors"
	"testing"
)

func TestBearerTokenRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		bearer      string
		node, token string
		ok          bool
	}{
		{BearerToken("node-1", "abc"), "node-1", "abc", true},
		{BearerToken("n.example.com", "a:b"), "n.example.com", "a:b", true},
		{"node::abc", "", "", false},
		{"node:n1:", "", "", false},
		{"abc", "", "", false},
		{"node:n1", "", "", false},
	} {
		node, token, ok := ParseBearerToken(tc.bearer)
		if node != tc.node || token != tc.token || ok != tc.ok {
			t.Errorf("ParseBearerToken(%q) = %q, %q, %v; want %q, %q, %v", tc.bearer, node, token, ok, tc.node, tc.token, tc.ok)
		}
	}
}

func TestVerifyCA(t *testing.T) {
	ca := "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
	good := CAResponse{CA: ca, HMAC: CAHMAC("secret", []byte(ca))}
	if got, err := VerifyCA("secret", good); err != nil || string(got) != ca {
		t.Fatalf("VerifyCA with the right token: %q, %v", got, err)
	}
	for name, tc := range map[string]struct {
		token string
		resp  CAResponse
	}{
		"wrong token":   {"other", good},
		"swapped CA":    {"secret", CAResponse{CA: ca + "x", HMAC: good.HMAC}},
		"garbage HMAC":  {"secret", CAResponse{CA: ca, HMAC: "zz"}},
		"missing HMAC":  {"secret", CAResponse{CA: ca}},
		"attacker's CA": {"secret", CAResponse{CA: "evil", HMAC: CAHMAC("guess", []byte("evil"))}},
	} {
		if _, err := VerifyCA(tc.token, tc.resp); !errors.Is(err, ErrCAMismatch) {
			t.Errorf("%s: err %v, want ErrCAMismatch", name, err)
		}
	}
}
