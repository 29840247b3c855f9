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

func TestConsecutiveClaimsConsecutivePorts(t *testing.T) {
	first := Consecutive(t, 3)
	for p := first; p < first+3; p++ {
		if claims[p] == nil {
			t.Fatalf("port %d of the run from %d is not claimed", p, first)
		}
		if _, err := net.Listen("unix", claimName(p)); err == nil {
			t.Fatalf("port %d of the run could be claimed again", p)
		}
	}
}

// A failed claim of a run gives back only what it claimed: a port handed out before stays claimed.
func TestClaimFreeKeepsEarlierClaims(t *testing.T) {
	held := One(t)
	mu.Lock()
	defer mu.Unlock()
	neighbourBefore := claims[held-1] != nil
	if claimFree([]string{"127.0.0.1"}, held-1, 2) {
		t.Fatalf("claimed a run over port %d, which was handed out already", held)
	}
	if claims[held] == nil || (claims[held-1] != nil) != neighbourBefore {
		t.Fatalf("claims after the failed run: %d=%v (before %v) %d=%v", held-1, claims[held-1] != nil, neighbourBefore, held, claims[held] != nil)
	}
}
