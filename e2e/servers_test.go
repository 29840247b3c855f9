package e2e

import (
	"fmt"
	"math/rand"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/internal/proctest"
)

// Three `skiff server` processes on 127.0.0.1-3, started in random order from HCL files, form one cluster;
// after kill -9 of the leader a new leader appears, and the old leader, restarted, rejoins as a follower.
func TestThreeServerProcessesFailover(t *testing.T) {
	parallel(t)
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewSource(seed))
	c := proctest.NewCluster(t, 3, "")
	for _, i := range r.Perm(3) {
		c.Start(c.Procs[i])
		time.Sleep(time.Duration(r.Intn(700)) * time.Millisecond)
	}
	first := c.Procs[0]
	proctest.WaitFor(t, "admin kubeconfig", 30*time.Second, func() error {
		_, err := os.Stat(first.Kubeconfig())
		return err
	})
	oldLeader := c.ByName(c.HealthyPeers(first, 3))
	// `skiff operator health` is a probe: exit 0 while the cluster is healthy, not once a server is gone.
	proctest.WaitFor(t, "operator health to pass", 30*time.Second, func() error {
		if out, err := c.Operator(first, "health"); err != nil || !strings.Contains(out, "failure tolerance: 1") {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})

	c.Kill(oldLeader)
	var survivor *proctest.Proc
	for _, p := range c.Procs {
		if p != oldLeader {
			survivor = p
			break
		}
	}
	proctest.WaitFor(t, "operator health to fail with a server gone", 30*time.Second, func() error {
		if out, err := c.Operator(survivor, "health"); err == nil || !strings.Contains(out, "failure tolerance: 0") {
			return fmt.Errorf("exit %v: %s", err, out)
		}
		return nil
	})
	proctest.WaitFor(t, "a new leader", 30*time.Second, func() error {
		out, err := c.Operator(survivor, "raft", "list-peers")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		rows, err := proctest.ParsePeers(out)
		if err != nil {
			return err
		}
		for _, r := range rows {
			if r.State == "leader" && r.Name != oldLeader.Name {
				return nil
			}
		}
		return fmt.Errorf("no new leader yet:\n%s", out)
	})

	c.Start(oldLeader)
	newLeader := c.HealthyPeers(oldLeader, 3)
	if newLeader == oldLeader.Name {
		t.Fatalf("restarted %s took leadership back; expected it to rejoin as a follower", oldLeader.Name)
	}
	// Graceful shutdown of every server exits cleanly.
	for _, p := range c.Procs {
		if err := c.Stop(p); err != nil {
			t.Errorf("stopping %s: %v", p.Name, err)
		}
	}
}
