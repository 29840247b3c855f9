// Package freeport hands tests ports to listen on, for TCP and UDP alike.
//
// Ports come from below Linux's ephemeral range (32768-60999), so that no outgoing connection of a process
// started earlier can take one before the process meant to listen on it binds it (seen as "address already in
// use" when a server started).
//
// A port is handed out once per machine, not just once per process: `go test ./...` runs packages in parallel
// processes, and a test that stops a server and starts it again on the same port (a restart) leaves that port
// unbound for a moment, when another process's check would find it free. Each port handed out is therefore
// claimed by binding the abstract Unix socket "@skiff-freeport-<port>", which the kernel releases when the
// process exits, however it exits, and which leaves nothing behind on disk.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
)

var (
	mu sync.Mutex
	// claims holds this process's claim on each port it handed out. A closed (or garbage-collected) listener
	// would release the claim, so they are kept for the life of the process.
	claims = map[int]net.Listener{}
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
		if claims[port] != nil || !claim(port) {
			continue
		}
		if !Free(ips, port) {
			release([]int{port})
			continue
		}
		ports = append(ports, port)
	}
	return ports
}

// claim claims port for this process machine-wide; it fails when another process (or this one) holds it.
func claim(port int) bool {
	l, err := net.Listen("unix", claimName(port))
	if err != nil {
		return false
	}
	claims[port] = l
	return true
}

func release(ports []int) {
	for _, p := range ports {
		claims[p].Close()
		delete(claims, p)
	}
}

func free(ips []string, ports []int) bool {
	for _, p := range ports {
		if !Free(ips, p) {
			return false
		}
	}
	return true
}

func claimName(port int) string { return fmt.Sprintf("@skiff-freeport-%d", port) }

// Run returns the first of n consecutive ports free for TCP and UDP on 127.0.0.1, for programs that take a
// base port and use the ones after it.
func Run(t testing.TB, n int) int {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	for tries := 0; tries < 10000; tries++ {
		first := 20000 + rand.IntN(32768-20000-n)
		var got []int
		for p := first; p < first+n && claims[p] == nil && claim(p); p++ {
			got = append(got, p)
		}
		if len(got) == n && free([]string{"127.0.0.1"}, got) {
			return first
		}
		release(got)
	}
	t.Fatalf("no %d consecutive free ports", n)
	return 0
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
