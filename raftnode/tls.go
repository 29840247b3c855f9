package raftnode

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"
)

// ServerName is the name in every server's Raft certificate, and the only name a peer accepts on the Raft
// port, as Nomad's server.<region>.nomad with verify_server_hostname. Certificates that the CSR API signs
// (node and user client certificates, node serving certificates) never carry it with both usages below, so
// they cannot open a Raft or RPC connection.
const ServerName = "server.skiff"

// Credentials hand the TLS layer this server's certificate and the CA pool peers are checked against, at the
// time of each handshake: a server that has not got its certificate yet refuses and fails every handshake.
type Credentials interface {
	RaftCredentials() (*tls.Certificate, *x509.CertPool, error)
}

// TLSLayer is the Layer of a cluster with a CA: mutual TLS 1.3, each side checking that the other holds a
// certificate from the cluster CA for ServerName, usable both as a server and as a client.
type TLSLayer struct{ Creds Credentials }

// Listen accepts TLS connections; the handshake runs on the connection's first read (in the mux).
func (l TLSLayer) Listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return tls.NewListener(ln, &tls.Config{MinVersion: tls.VersionTLS13, GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		cert, pool, err := l.Creds.RaftCredentials()
		if err != nil {
			return nil, err
		}
		return &tls.Config{
			MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{*cert},
			ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool, VerifyConnection: checkServerPeer,
		}, nil
	}}), nil
}

// Dial connects and completes the handshake within timeout.
func (l TLSLayer) Dial(addr string, timeout time.Duration) (net.Conn, error) {
	cert, pool, err := l.Creds.RaftCredentials()
	if err != nil {
		return nil, err
	}
	d := &net.Dialer{Timeout: timeout}
	return tls.DialWithDialer(d, "tcp", addr, &tls.Config{
		MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{*cert},
		RootCAs: pool, ServerName: ServerName, VerifyConnection: checkServerPeer,
	})
}

// checkServerPeer runs after the chain is verified (for client auth on the listening side, for server auth
// and ServerName on the dialing side): the peer's certificate must name ServerName and allow both usages.
func checkServerPeer(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("the peer presented no certificate")
	}
	leaf := cs.PeerCertificates[0]
	if err := leaf.VerifyHostname(ServerName); err != nil {
		return fmt.Errorf("not a server certificate: %w", err)
	}
	if !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageServerAuth) || !slices.Contains(leaf.ExtKeyUsage, x509.ExtKeyUsageClientAuth) {
		return fmt.Errorf("not a server certificate: %q must allow both server and client authentication", leaf.Subject.CommonName)
	}
	return nil
}
