package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestHandoverKeepsThePortOpen: between the bootstrap server's shutdown and the API server's first Accept, a
// client that connects is not refused: it waits in the backlog and the API server answers it. Closing and
// listening again, as servers did before, refused it.
func TestHandoverKeepsThePortOpen(t *testing.T) {
	ln, err := newHandoverListener("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.release()
	addr := ln.Addr().String()
	serve := func(l net.Listener, who string) (*http.Server, chan error) {
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, who) }), ReadHeaderTimeout: 5 * time.Second}
		done := make(chan error, 1)
		go func() { done <- srv.Serve(l) }()
		return srv, done
	}
	get := func(conn net.Conn) (string, error) {
		if _, err := fmt.Fprintf(conn, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"); err != nil {
			return "", err
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		var b strings.Builder
		_, err = bufio.NewReader(resp.Body).WriteTo(&b)
		return b.String(), err
	}
	boot, bootDone := serve(ln, "bootstrap")
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if body, err := get(conn); err != nil || body != "bootstrap" {
		t.Fatalf("before the handover: %q, %v", body, err)
	}
	if err := boot.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-bootDone; !errors.Is(err, http.ErrServerClosed) {
		t.Fatalf("the bootstrap server ended with %v", err)
	}
	// In between: the connection is accepted by the kernel, not refused.
	waiting, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatalf("connecting between the two servers: %v", err)
	}
	defer waiting.Close()
	taken, err := ln.take()
	if err != nil {
		t.Fatal(err)
	}
	api, apiDone := serve(taken, "api")
	if body, err := get(waiting); err != nil || body != "api" {
		t.Fatalf("the connection made in between: %q, %v", body, err)
	}
	api.Close()
	<-apiDone
}
