package server

import (
	"net"
	"sync"
	"time"
)

// handoverListener is the API port's socket, served first by the bootstrap server (/livez, /readyz, the join
// endpoints) and then by the Kubernetes API. The bootstrap server's shutdown stops its Accept without closing
// the socket (a deadline in the past), and the API server takes the same socket over: a client that connects
// in between waits in the backlog until the API serves it, where a close and a new listen refused it (a
// restarted server refused connections for seconds after its /readyz had said ok).
type handoverListener struct {
	*net.TCPListener
	mu      sync.Mutex
	stopped bool // the bootstrap server let go
	taken   bool // the API server has the socket
}

func newHandoverListener(addr string) (*handoverListener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return &handoverListener{TCPListener: ln.(*net.TCPListener)}, nil
}

// Accept is the bootstrap server's, until Close.
func (l *handoverListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	stopped := l.stopped
	l.mu.Unlock()
	if stopped {
		return nil, net.ErrClosed
	}
	c, err := l.TCPListener.Accept()
	if err != nil {
		l.mu.Lock()
		stopped = l.stopped
		l.mu.Unlock()
		if stopped {
			return nil, net.ErrClosed
		}
	}
	return c, err
}

// Close, called by the bootstrap server's shutdown, ends its Accept and keeps the socket open.
func (l *handoverListener) Close() error {
	l.mu.Lock()
	l.stopped = true
	l.mu.Unlock()
	return l.TCPListener.SetDeadline(time.Now())
}

// take hands the socket to the API server, once the bootstrap server's Serve has returned.
func (l *handoverListener) take() (net.Listener, error) {
	l.mu.Lock()
	l.taken = true
	l.mu.Unlock()
	return l.TCPListener, l.TCPListener.SetDeadline(time.Time{})
}

// release closes the socket if the API server never took it (a server stopped before the cluster had its CA).
func (l *handoverListener) release() {
	l.mu.Lock()
	taken := l.taken
	l.mu.Unlock()
	if !taken {
		l.TCPListener.Close()
	}
}
