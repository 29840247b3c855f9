package e2e

import (
	"fmt"
	"math/rand"
	"os"
	"testing"
	"time"
)

// Three `skiff server` processes on 127.0.0.1-3, started in random order from HCL files, form one cluster;
// after kill -9 of the leader a new leader appears, and the old leader, restarted, rejoins as a follower.
func TestThreeServerProcessesFailover(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewSource(seed))
	c := newCluster(t, 3)
	for _, i := range r.Perm(3) {
		c.start(c.procs[i])
		time.Sleep(time.Duration(r.Intn(700)) * time.Millisecond)
	}
	first := c.procs[0]
	waitFor(t, "admin kubeconfig", 30*time.Second, func() error {
		_, err := os.Stat(first.kubeconfig())
		return err
	})
	oldLeader := c.byName(c.healthyPeers(first, 3))

	c.kill(oldLeader)
	var survivor *proc
	for _, p := range c.procs {
		if p != oldLeader {
			survivor = p
			break
		}
	}
	waitFor(t, "a new leader", 30*time.Second, func() error {
		out, err := c.operator(survivor, "raft", "list-peers")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		rows, err := parsePeers(out)
		if err != nil {
			return err
		}
		for _, r := range rows {
			if r.state == "leader" && r.name != oldLeader.name {
				return nil
			}
		}
		return fmt.Errorf("no new leader yet:\n%s", out)
	})

	c.start(oldLeader)
	newLeader := c.healthyPeers(oldLeader, 3)
	if newLeader == oldLeader.name {
		t.Fatalf("restarted %s took leadership back; expected it to rejoin as a follower", oldLeader.name)
	}
	// Graceful shutdown of every server exits cleanly.
	for _, p := range c.procs {
		if err := c.stop(p); err != nil {
			t.Errorf("stopping %s: %v", p.name, err)
		}
	}
}
