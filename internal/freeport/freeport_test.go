package freeport

import (
	"net"
	"testing"
)

func TestTakeHandsOutDistinctFreePorts(t *testing.T) {
	ports := Take(t, []string{"127.0.0.1"}, 50)
	seen := map[int]bool{}
	for _, p := range ports {
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
		if p < 20000 || p >= 32768 {
			t.Fatalf("port %d outside 20000-32767", p)
		}
		if !Free([]string{"127.0.0.1"}, p) {
			t.Fatalf("port %d is not free", p)
		}
	}
}

// A port another process claimed is not claimed again: the claim is the kernel's abstract socket name, which
// a second bind fails on whichever process holds it.
func TestClaimFailsWhileAnotherHoldsThePort(t *testing.T) {
	port := 20000
	other, err := net.Listen("unix", claimName(port)) // as another process would
	for ; err != nil; other, err = net.Listen("unix", claimName(port)) {
		if port++; port == 32768 {
			t.Fatal("every port is claimed")
		}
	}
	mu.Lock()
	got := claim(port)
	mu.Unlock()
	if got {
		t.Fatalf("claimed port %d while another holder has it", port)
	}
	other.Close()
	mu.Lock()
	got = claim(port)
	mu.Unlock()
	if !got {
		t.Fatalf("could not claim port %d after its holder released it", port)
	}
}

func TestRunClaimsConsecutivePorts(t *testing.T) {
	first := Run(t, 3)
	for p := first; p < first+3; p++ {
		if claims[p] == nil {
			t.Fatalf("port %d of the run from %d is not claimed", p, first)
		}
		if _, err := net.Listen("unix", claimName(p)); err == nil {
			t.Fatalf("port %d of the run could be claimed again", p)
		}
	}
}
