package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/internal/proctest"
)

// TestQuorumLossRecovery: of three servers, two are killed and their data dirs wiped; `skiff operator raft
// recover` on the third (stopped) makes it a cluster of one that serves every object acknowledged before;
// the two come back empty, get their certificates through the server join, and are added: three voters
// again, serving the same objects. The survivor is the last by name, so the fresh servers come first in any
// bootstrap plan and must not draw a CA of their own.
func TestQuorumLossRecovery(t *testing.T) {
	parallel(t)
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Skip("kubectl not installed")
	}
	c := proctest.NewCluster(t, 3, "")
	for _, p := range c.Procs {
		c.Start(p)
	}
	survivor, lost := c.Procs[2], c.Procs[:2]
	c.HealthyPeers(survivor, 3)
	k := kubectl{t: t, kubeconfig: survivor.Kubeconfig()}
	k.waitForAPI("default")
	const objects = 20
	for i := range objects {
		k.ok("create", "configmap", fmt.Sprintf("before-%02d", i), fmt.Sprintf("--from-literal=i=%d", i))
	}

	for _, p := range lost {
		c.Kill(p)
		if err := os.RemoveAll(p.Dir); err != nil {
			t.Fatal(err)
		}
	}
	c.Kill(survivor)
	out, err := exec.Command(proctest.Binary(t), "operator", "raft", "recover", survivor.Config).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "as the only voter") {
		t.Fatalf("skiff operator raft recover: %v\n%s", err, out)
	}
	mustContain(t, "the warning", string(out), "never have committed")

	c.Start(survivor)
	c.HealthyPeers(survivor, 1)
	k.waitForAPI("default")
	checkObjects := func(k kubectl) {
		t.Helper()
		got := k.ok("get", "configmaps", "-o", "name")
		for i := range objects {
			mustContain(t, "the configmaps", got, fmt.Sprintf("configmap/before-%02d", i))
		}
	}
	checkObjects(k)

	for _, p := range lost {
		c.Start(p)
	}
	c.HealthyPeers(survivor, 3)
	fresh := kubectl{t: t, kubeconfig: lost[0].Kubeconfig()}
	proctest.WaitFor(t, "the fresh server's kubeconfig", 60*time.Second, func() error {
		_, err := os.Stat(lost[0].Kubeconfig())
		return err
	})
	fresh.waitForAPI("default")
	checkObjects(fresh)
}
