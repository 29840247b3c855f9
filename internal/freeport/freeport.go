// Package freeport hands tests ports to listen on, for TCP and UDP alike. Ports come from below Linux's
// ephemeral range (32768-60999), so that no outgoing connection of a process started earlier can take one
// before the process meant to listen on it binds it (seen as "address already in use" when a server
// started), and no port is handed out twice in one test process.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
)

var (
	mu        sync.Mutex
	handedOut = map[int]bool{}
)

// Take returns n ports free for TCP and UDP on every one of ips.
func Take(t testing.TB, ips []string, n int) []int {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	var ports []int
	for tries := 0; len(ports) < n; tries++ {
		if tries > 10000 {
			t.Fatalf("no free port for %v", ips)
		}
		port := 20000 + rand.IntN(32768-20000)
		if handedOut[port] || !Free(ips, port) {
			continue
		}
		handedOut[port] = true
		ports = append(ports, port)
	}
	return ports
}

// One returns one port free for TCP and UDP on 127.0.0.1, or on ip when given.
func One(t testing.TB, ip ...string) int {
	t.Helper()
	if len(ip) == 0 {
		ip = []string{"127.0.0.1"}
	}
	return Take(t, ip, 1)[0]
}

// Free reports whether port is free for TCP and UDP on every one of ips.
func Free(ips []string, port int) bool {
	for _, ip := range ips {
		addr := fmt.Sprintf("%s:%d", ip, port)
		l, err1 := net.Listen("tcp", addr)
		u, err2 := net.ListenPacket("udp", addr)
		if l != nil {
			l.Close()
		}
		if u != nil {
			u.Close()
		}
		if err1 != nil || err2 != nil {
			return false
		}
	}
	return true
}
