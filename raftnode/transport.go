package raftnode

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/raft"
)

// Layer makes the connections between peers. TCPLayer is plain TCP; a TLS layer can replace it without any
// caller changing.
type Layer interface {
	Listen(addr string) (net.Listener, error)
	Dial(addr string, timeout time.Duration) (net.Conn, error)
}

// TCPLayer is the plain TCP Layer.
type TCPLayer struct{}

func (TCPLayer) Listen(addr string) (net.Listener, error) { return net.Listen("tcp", addr) }
func (TCPLayer) Dial(addr string, timeout time.Duration) (net.Conn, error) {
	return net.DialTimeout("tcp", addr, timeout)
}

// One port carries two protocols; the first byte of a connection says which.
const (
	protoRaft byte = 'R'
	protoRPC  byte = 'C'
)

// mux accepts connections on the Raft port and hands each to the Raft transport or to the RPC server.
type mux struct {
	ln     net.Listener
	raft   chan net.Conn
	rpc    chan net.Conn
	closed chan struct{}
	once   sync.Once
	logger hclog.Logger
}

func newMux(ln net.Listener, logger hclog.Logger) *mux {
	m := &mux{ln: ln, raft: make(chan net.Conn), rpc: make(chan net.Conn), closed: make(chan struct{}), logger: logger}
	go m.acceptLoop()
	return m
}

func (m *mux) acceptLoop() {
	for {
		conn, err := m.ln.Accept()
		if err != nil {
			select {
			case <-m.closed:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			m.logger.Error("accept failed", "error", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		go m.route(conn)
	}
}

func (m *mux) route(conn net.Conn) {
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	var b [1]byte
	if _, err := conn.Read(b[:]); err != nil {
		// With TLS the handshake runs in this read: a client without a server certificate ends here.
		if _, isTLS := conn.(*tls.Conn); isTLS && !errors.Is(err, io.EOF) {
			m.logger.Warn("refused a connection on the raft port", "remote", conn.RemoteAddr(), "error", err)
		}
		conn.Close()
		return
	}
	conn.SetReadDeadline(time.Time{})
	var ch chan net.Conn
	switch b[0] {
	case protoRaft:
		ch = m.raft
	case protoRPC:
		ch = m.rpc
	default:
		m.logger.Warn("unknown protocol byte, closing connection", "byte", b[0], "remote", conn.RemoteAddr())
		conn.Close()
		return
	}
	select {
	case ch <- conn:
	case <-m.closed:
		conn.Close()
	}
}

func (m *mux) Close() error {
	m.once.Do(func() { close(m.closed) })
	return m.ln.Close()
}

// subListener is the net.Listener view of one protocol on the mux.
type subListener struct {
	m     *mux
	ch    chan net.Conn
	addr  net.Addr
	proto byte
	layer Layer
}

func (l *subListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.m.closed:
		return nil, net.ErrClosed
	}
}

func (l *subListener) Close() error   { return l.m.Close() }
func (l *subListener) Addr() net.Addr { return l.addr }

// Dial opens a connection to a peer's mux for this listener's protocol. It makes subListener a
// raft.StreamLayer.
func (l *subListener) Dial(address raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return dialProto(l.layer, string(address), l.proto, timeout)
}

func dialProto(layer Layer, addr string, proto byte, timeout time.Duration) (net.Conn, error) {
	conn, err := layer.Dial(addr, timeout)
	if err != nil {
		return nil, err
	}
	conn.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := conn.Write([]byte{proto}); err != nil {
		conn.Close()
		return nil, err
	}
	conn.SetWriteDeadline(time.Time{})
	return conn, nil
}

// resolveAdvertise returns the address peers should dial: advertise when set, else the listener's address.
func resolveAdvertise(advertise string, ln net.Listener) (net.Addr, error) {
	if advertise == "" {
		return ln.Addr(), nil
	}
	addr, err := net.ResolveTCPAddr("tcp", advertise)
	if err != nil {
		return nil, fmt.Errorf("advertise address %q: %w", advertise, err)
	}
	if addr.IP == nil || addr.IP.IsUnspecified() {
		return nil, fmt.Errorf("advertise address %q must name a routable IP", advertise)
	}
	return addr, nil
}
