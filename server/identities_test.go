package server

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"
)

// TestCloseWhenDoneClosesConnections: a leader service's transport keeps no connection once the service's
// context ends, over HTTP/2 as client-go uses it (without it, every leadership term left its connections and
// their goroutines behind).
func TestCloseWhenDoneClosesConnections(t *testing.T) {
	var open atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	srv.EnableHTTP2 = true
	srv.Config.ConnState = func(_ net.Conn, state http.ConnState) {
		switch state {
		case http.StateNew:
			open.Add(1)
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
	srv.StartTLS()
	defer srv.Close()
	transport := utilnet.SetTransportDefaults(&http.Transport{TLSClientConfig: srv.Client().Transport.(*http.Transport).TLSClientConfig})
	resp, err := (&http.Client{Transport: transport}).Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.ProtoMajor != 2 || open.Load() != 1 {
		t.Fatalf("HTTP/%d, %d connections open; want HTTP/2 and one", resp.ProtoMajor, open.Load())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { closeWhenDone(ctx, transport, time.Millisecond); close(done) }()
	time.Sleep(50 * time.Millisecond)
	if open.Load() != 1 {
		t.Fatal("the connection closed before the context ended")
	}
	cancel()
	<-done
	for deadline := time.Now().Add(5 * time.Second); open.Load() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections still open after the context ended", open.Load())
		}
	}
}
