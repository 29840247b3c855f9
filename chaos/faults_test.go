package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/localcluster"
)

// TestFaults brings up `skiff local up --servers 3 --agents 2` and injects and heals each fault of Faults in
// turn, holding it for a few seconds; after each heal every server must answer /readyz, a majority agree
// on a leader, and both agents be alive with their Nodes Ready. At the end CleanupFaults and Down must leave
// no mount or loop device behind. `go test -run 'TestFaults/netem'` runs one fault; SKIFF_CHAOS_HOLD sets how
// long each fault lasts (3s), SKIFF_CHAOS_REPEAT how many times each runs (1).
func TestFaults(t *testing.T) {
	requireLocalCluster(t)
	hold := 3 * time.Second
	if v := os.Getenv("SKIFF_CHAOS_HOLD"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("SKIFF_CHAOS_HOLD: %v", err)
		}
		hold = d
	}
	repeat := 1
	if v := os.Getenv("SKIFF_CHAOS_REPEAT"); v != "" {
		if _, err := fmt.Sscan(v, &repeat); err != nil || repeat < 1 {
			t.Fatalf("SKIFF_CHAOS_REPEAT=%q: want a count", v)
		}
	}
	l := upLocal(t, proctest.Binary(t))
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	var sb strings.Builder
	fmt.Fprintf(&sb, "%-22s %10s %10s %10s\n", "FAULT", "INJECT", "HEAL", "HEALTHY")
	// A test that dies on go test's -timeout runs no cleanup and would leave the cluster running, so the
	// faults stop while there is time left for the slowest one (8 minutes) and the cluster's teardown.
	deadline, bounded := t.Deadline()
rounds:
	for r := range repeat {
		for i, f := range Faults {
			if bounded && time.Until(deadline) < 10*time.Minute {
				t.Errorf("%v left before the test's deadline (-timeout): %s and the faults after it are not run", time.Until(deadline).Round(time.Second), f.Name)
				break rounds
			}
			t.Run(f.Name, func(t *testing.T) {
				var tm faultTiming
				defer func() {
					status := ""
					if t.Failed() {
						status = "FAILED"
					} else if t.Skipped() {
						status = "skipped"
					}
					fmt.Fprintf(&sb, "%-22s %10v %10v %10v %s\n", f.Name, tm.inject.Round(time.Millisecond),
						tm.heal.Round(time.Millisecond), tm.healthy.Round(time.Millisecond), status)
				}()
				injectAndHeal(t, l, f, rand.New(rand.NewPCG(seed+uint64(r), uint64(i))), hold, &tm)
			})
		}
	}
	t.Logf("timings (hold %v):\n%s", hold, sb.String())
}

// faultTiming is how long a fault's steps took.
type faultTiming struct{ inject, heal, healthy time.Duration }

// injectAndHeal injects a fault, holds it, heals it (twice: the second does nothing) and waits until the
// cluster is healthy, recording how long each step took.
func injectAndHeal(t *testing.T, l *Local, f Fault, rng *rand.Rand, hold time.Duration, tm *faultTiming) {
	switch f.Name {
	case "netem":
		requireTools(t, "tc")
	case "disk-full":
		requireTools(t, "mkfs.ext4", "losetup", "mount", "umount")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	logf := func(format string, args ...any) { t.Logf(f.Name+": "+format, args...) }
	start := time.Now()
	heal, err := f.Inject(ctx, l, rng, logf)
	tm.inject = time.Since(start)
	if err != nil {
		t.Errorf("inject: %v", err)
	}
	if heal != nil {
		time.Sleep(hold) // the fault in force
		start = time.Now()
		if err := heal(ctx); err != nil {
			t.Errorf("heal: %v", err)
		}
		tm.heal = time.Since(start)
		if err := heal(ctx); err != nil {
			t.Errorf("second heal: %v", err)
		}
	}
	start = time.Now()
	if err := waitHealthy(ctx, l); err != nil {
		t.Fatalf("after the heal: %v", err)
	}
	tm.healthy = time.Since(start)
}

// waitHealthy waits until every server answers /readyz, a majority agrees on a leader, and every agent is
// alive with its Node Ready.
func waitHealthy(ctx context.Context, l *Local) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for _, h := range l.State.Hosts {
		if err := l.WaitReady(ctx, h.Name); err != nil {
			return err
		}
	}
	_, err := l.Leader(ctx)
	return err
}

// requireLocalCluster skips unless the machine can run `skiff local` with real pods: root, containerd, runc,
// the CNI plugins, and the network tools.
func requireLocalCluster(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("a local cluster needs root")
	}
	requireTools(t, "containerd", "runc", "ip", "iptables", "nsenter")
	if _, err := os.Stat("/usr/lib/cni/bridge"); err != nil {
		t.Skip("containernetworking-plugins not installed (make setup installs it)")
	}
}

func requireTools(t *testing.T, tools ...string) {
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
}

// upLocal runs `skiff local up --servers 3 --agents 2` in a temporary directory (a short path: containerd's
// socket must fit in 107 bytes). The test's cleanup logs the hosts' logs when it failed, undoes the faults
// (CleanupFaults), takes the cluster down, and checks that no mount or loop device is left.
func upLocal(t *testing.T, bin string) *Local {
	t.Helper()
	dir, err := os.MkdirTemp("", "skiff-chaos-")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "local", "up", "--servers", "3", "--agents", "2", "--dir", dir).CombinedOutput()
	st, loadErr := localcluster.Load(dir)
	t.Cleanup(func() {
		if t.Failed() && st != nil {
			for _, h := range st.Hosts {
				t.Logf("--- %s log (tail) ---\n%s", h.Name, logTail(h.Log, 3000))
			}
		}
		if err := localcluster.CleanupFaults(dir); err != nil {
			t.Errorf("CleanupFaults: %v", err)
		}
		if st != nil {
			if err := localcluster.Down(dir); err != nil {
				t.Errorf("Down: %v", err)
			}
		}
		if err := localcluster.ReleaseDataDirs(dir); err != nil {
			t.Errorf("ReleaseDataDirs after Down: %v", err)
		}
		mounts, _ := os.ReadFile("/proc/self/mountinfo")
		if strings.Contains(string(mounts), dir) {
			t.Errorf("mounts left under %s:\n%s", dir, grepLines(string(mounts), dir))
		}
		if loops, err := exec.Command("losetup", "--list").Output(); err == nil && strings.Contains(string(loops), dir) {
			t.Errorf("loop devices left on %s:\n%s", dir, grepLines(string(loops), dir))
		}
		os.RemoveAll(dir)
	})
	if err != nil || loadErr != nil {
		t.Fatalf("skiff local up: %v %v\n%s", err, loadErr, out)
	}
	return &Local{Dir: dir, Bin: bin, State: st}
}

func grepLines(s, sub string) string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, sub) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
