// Package freeport hands tests ports to listen on, for TCP and UDP alike.
//
// Ports come from below Linux's ephemeral range (32768-60999), so that no outgoing connection of a process
// started earlier can take one before the process meant to listen on it binds it (seen as "address already in
// use" when a server started).
//
// A port is handed out once per network namespace (the ports' own scope), not just once per process: `go test
// ./...` runs packages in parallel processes, and a test that stops a server and starts it again on the same
// port (a restart) leaves that port unbound for a moment, when another process's check would find it free.
// Each port handed out is therefore claimed by binding the abstract Unix socket "@skiff-freeport-<port>",
// which the kernel releases when the process exits, however it exits, and which leaves nothing on disk.
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

// lowest and end bound the ports handed out: [lowest, end), below the ephemeral range.
const lowest, end = 20000, 32768

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
		if port := lowest + rand.IntN(end-lowest); claimFree(ips, port, 1) {
			ports = append(ports, port)
		}
	}
	return ports
}

// Consecutive returns the first of n consecutive ports free for TCP and UDP on 127.0.0.1, for programs that
// take a base port and use the ones after it.
func Consecutive(t testing.TB, n int) int {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	for tries := 0; tries < 10000; tries++ {
		if first := lowest + rand.IntN(end-lowest-n); claimFree([]string{"127.0.0.1"}, first, n) {
			return first
		}
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

// claimFree claims ports first..first+n-1 when every one is unclaimed and free on ips, and claims none
// otherwise. mu is held.
func claimFree(ips []string, first, n int) bool {
	for p := first; p < first+n; p++ {
		if claims[p] != nil || !claim(p) { // p is someone else's: keep its claim
			release(first, p)
			return false
		}
		if !Free(ips, p) {
			release(first, p+1)
			return false
		}
	}
	return true
}

// claim claims port for this process; it fails when another process (or this one) holds it.
func claim(port int) bool {
	l, err := net.Listen("unix", claimName(port))
	if err != nil {
		return false
	}
	claims[port] = l
	return true
}

// release gives up this process's claims on ports [from, to) that claimFree just made.
func release(from, to int) {
	for p := from; p < to; p++ {
		if l := claims[p]; l != nil {
			l.Close()
			delete(claims, p)
		}
	}
}

func claimName(port int) string { return fmt.Sprintf("@skiff-freeport-%d", port) }

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
