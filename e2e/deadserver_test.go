package e2e

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/internal/proctest"
)

// TestDeadServerCleanup, with server processes and dead_server_cleanup = 5s: a dead server of three
// (bootstrap_expect 3) stays a voter, since removing it would leave fewer voters than bootstrap_expect; a
// replacement joins, becomes a voter, and then the dead server is removed; a second dead server stays.
func TestDeadServerCleanup(t *testing.T) {
	parallel(t)
	const cleanup = 5 * time.Second
	c := proctest.NewCluster(t, 3, fmt.Sprintf("dead_server_cleanup = %q\n", cleanup))
	for _, p := range c.Procs {
		c.Start(p)
	}
	proctest.WaitFor(t, "admin kubeconfig", 30*time.Second, func() error {
		_, err := os.Stat(c.Procs[0].Kubeconfig())
		return err
	})
	leader := c.ByName(c.HealthyPeers(c.Procs[0], 3))
	var followers []*proctest.Proc
	for _, p := range c.Procs {
		if p != leader {
			followers = append(followers, p)
		}
	}
	// peers lists the Raft configuration through a live server, by name.
	peers := func(via *proctest.Proc) (map[string]proctest.PeerRow, error) {
		out, err := c.Operator(via, "raft", "list-peers")
		if err != nil {
			return nil, fmt.Errorf("%v: %s", err, out)
		}
		rows, err := proctest.ParsePeers(out)
		if err != nil {
			return nil, err
		}
		byName := map[string]proctest.PeerRow{}
		for _, r := range rows {
			byName[r.Name] = r
		}
		return byName, nil
	}
	// staysVoter checks, for three times the cleanup period, that dead is still a voter of the configuration.
	staysVoter := func(dead, via *proctest.Proc) {
		t.Helper()
		for end := time.Now().Add(3 * cleanup); time.Now().Before(end); time.Sleep(time.Second) {
			rows, err := peers(via)
			if err != nil {
				continue // a leader change under the kill: ask again
			}
			if r, ok := rows[dead.Name]; !ok || r.Voter != "true" {
				t.Fatalf("%s removed below bootstrap_expect: %v", dead.Name, rows)
			}
		}
	}

	first := followers[0]
	c.Kill(first)
	staysVoter(first, leader)

	replacement := c.Add()
	c.Start(replacement)
	proctest.WaitFor(t, "the replacement a voter and the dead server removed", 90*time.Second, func() error {
		rows, err := peers(leader)
		if err != nil {
			return err
		}
		if r, ok := rows[replacement.Name]; !ok || r.Voter != "true" {
			return fmt.Errorf("%s not a voter yet: %v", replacement.Name, rows)
		}
		if _, ok := rows[first.Name]; ok {
			return fmt.Errorf("%s still in the configuration: %v", first.Name, rows)
		}
		if len(rows) != 3 {
			return fmt.Errorf("want 3 servers: %v", rows)
		}
		return nil
	})
	// The replacement serves the API with the cluster's objects.
	proctest.WaitFor(t, "the replacement's kubeconfig", 60*time.Second, func() error {
		_, err := os.Stat(replacement.Kubeconfig())
		return err
	})
	k := kubectl{t: t, kubeconfig: replacement.Kubeconfig()}
	k.waitForAPI("default")
	if out := k.ok("get", "namespace", "kube-system", "-o", "name"); !strings.Contains(out, "namespace/kube-system") {
		t.Fatalf("the replacement does not serve the cluster's objects: %s", out)
	}

	second := followers[1]
	c.Kill(second)
	staysVoter(second, leader)
}
