package raftnode

import (
	"crypto/tls"
	"crypto/x509"
	"strings"
	"testing"
)

// TestCheckServerPeer: only a certificate naming ServerName for both server and client authentication
// passes; the CSR API's node and user certificates have one usage each.
func TestCheckServerPeer(t *testing.T) {
	both := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	for _, tc := range []struct {
		name  string
		leaf  *x509.Certificate
		error string
	}{
		{"server certificate", &x509.Certificate{DNSNames: []string{ServerName}, ExtKeyUsage: both}, ""},
		{"node client certificate", &x509.Certificate{ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, "not a server certificate"},
		{"client usage only", &x509.Certificate{DNSNames: []string{ServerName}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, "both server and client"},
		{"serving usage only", &x509.Certificate{DNSNames: []string{ServerName}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, "both server and client"},
		{"another name", &x509.Certificate{DNSNames: []string{"node-1"}, ExtKeyUsage: both}, "not a server certificate"},
		{"no certificate", nil, "no certificate"},
	} {
		var cs tls.ConnectionState
		if tc.leaf != nil {
			cs.PeerCertificates = []*x509.Certificate{tc.leaf}
		}
		err := checkServerPeer(cs)
		if tc.error == "" && err != nil || tc.error != "" && (err == nil || !strings.Contains(err.Error(), tc.error)) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.error)
		}
	}
}
