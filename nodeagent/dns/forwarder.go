package dns

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"time"
)

// Forwarder relays TCP connections from a loopback port to the first API server that accepts, trying the
// servers in the order the agent's own client does (like k3s's agent load balancer). CoreDNS's client-go
// takes one URL; through the forwarder it gets the agent's failover across servers, including servers the
// agent learns by gossip later. TLS stays end to end between CoreDNS and the server: the forwarder sees
// only bytes.
type Forwarder struct {
	ln      net.Listener
	servers func() []string
	dialer  net.Dialer
	wg      sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

// NewForwarder listens on 127.0.0.1 on a free port; Serve relays until ctx ends.
func NewForwarder(servers func() []string) (*Forwarder, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	return &Forwarder{ln: ln, servers: servers, dialer: net.Dialer{Timeout: 2 * time.Second}, conns: map[net.Conn]struct{}{}}, nil
}

// Addr is the forwarder's host:port.
func (f *Forwarder) Addr() string { return f.ln.Addr().String() }

// Serve accepts and relays connections until ctx ends, then closes the listener and every relayed
// connection and waits for their goroutines.
func (f *Forwarder) Serve(ctx context.Context) {
	stop := context.AfterFunc(ctx, func() {
		f.ln.Close()
		f.mu.Lock()
		for c := range f.conns {
			c.Close()
		}
		f.mu.Unlock()
	})
	defer stop()
	for {
		conn, err := f.ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				break
			}
			time.Sleep(10 * time.Millisecond) // a transient accept error (too many files, say)
			continue
		}
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			f.relay(ctx, conn)
		}()
	}
	f.wg.Wait()
}

// track adds or removes a relayed connection from the set Serve closes when ctx ends.
func (f *Forwarder) track(c net.Conn, add bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if add {
		f.conns[c] = struct{}{}
	} else {
		delete(f.conns, c)
	}
}

func (f *Forwarder) relay(ctx context.Context, client net.Conn) {
	defer client.Close()
	var upstream net.Conn
	for _, addr := range f.servers() {
		c, err := f.dialer.DialContext(ctx, "tcp", addr)
		if err == nil {
			upstream = c
			break
		}
	}
	if upstream == nil {
		return // client-go sees the connection close and retries
	}
	defer upstream.Close()
	f.track(client, true)
	f.track(upstream, true)
	defer f.track(client, false)
	defer f.track(upstream, false)
	if ctx.Err() != nil {
		return
	}
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		// Half-close so the other direction can finish (a response in flight), then let it end.
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(upstream, client)
	go pipe(client, upstream)
	<-done
	<-done
}
