package server

import (
	"fmt"
	"testing"
	"time"

	rt "github.com/skiff-dev/skiff/raftnode/raftnodetest"
)

// TestAutopilot: a fourth server joins as a non-voter and votes only after the stabilization time; a dead
// voter is removed after dead_server_cleanup while bootstrap_expect voters remain, and not once removing it
// would leave fewer.
func TestAutopilot(t *testing.T) {
	peers := newPeers(t, 4, 3)
	for _, p := range peers {
		p.cfg.ServerStabilizationTime = 2 * time.Second
		p.cfg.DeadServerCleanup = 2 * time.Second
	}
	t.Cleanup(func() {
		for _, p := range peers {
			p.stop()
		}
	})
	for _, p := range peers[:3] {
		p.start(t)
	}
	waitOneCluster(t, peers[:3], 3)
	leader := func() *Server {
		for _, p := range peers {
			if p.srv != nil && p.srv.Node().IsLeader() {
				return p.srv
			}
		}
		return nil
	}
	suffrage := func(id string) string {
		l := leader()
		if l == nil {
			return "no leader"
		}
		servers, err := l.Node().Servers()
		if err != nil {
			return err.Error()
		}
		for _, sv := range servers {
			if sv.ID == id {
				if sv.Voter {
					return "voter"
				}
				return "nonvoter"
			}
		}
		return "absent"
	}

	peers[3].start(t)
	fourth := peers[3].cfg.Name
	// Bounds of a minute: the join (its Raft certificate first) and the stability wait share the two cores
	// with other test packages in make test; 20 s ran out once.
	rt.WaitFor(t, fourth+" added as a non-voter", time.Minute, func() error {
		if got := suffrage(fourth); got != "nonvoter" {
			return fmt.Errorf("%s is %s", fourth, got)
		}
		return nil
	})
	added := time.Now()
	rt.WaitFor(t, fourth+" promoted", time.Minute, func() error {
		if got := suffrage(fourth); got != "voter" {
			return fmt.Errorf("%s is %s", fourth, got)
		}
		return nil
	})
	if waited := time.Since(added); waited < time.Second {
		t.Fatalf("%s was promoted %v after it joined: before it could have been stable for 2s", fourth, waited)
	}

	// Four voters, bootstrap_expect 3: one dead voter goes.
	var victims []*testPeer
	for _, p := range peers[:3] {
		if !p.srv.Node().IsLeader() {
			victims = append(victims, p)
		}
	}
	victims[0].stop()
	rt.WaitFor(t, victims[0].cfg.Name+" removed", 30*time.Second, func() error {
		if got := suffrage(victims[0].cfg.Name); got != "absent" {
			return fmt.Errorf("%s is %s", victims[0].cfg.Name, got)
		}
		return nil
	})
	// Three voters: the next dead one stays, well past the cleanup time.
	victims[1].stop()
	time.Sleep(8 * time.Second)
	if got := suffrage(victims[1].cfg.Name); got != "voter" {
		t.Fatalf("%s is %s: removed below bootstrap_expect", victims[1].cfg.Name, got)
	}
}
