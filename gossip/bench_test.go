package gossip

import (
	"flag"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/internal/freeport"
)

var benchMembers = flag.Int("gossip.members", 100, "members in the gossip convergence benchmark")

// cpuTime is this process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkGossipConvergence runs -gossip.members pool members in this process, each its own memberlist on
// 127.0.0.1 with the LAN timings agents and servers use, and measures:
//   - the CPU cost per member at steady state (this process's CPU time over 20 s, divided by the members);
//   - the time for a new member to be seen alive by every member, over b.N joins.
func BenchmarkGossipConvergence(b *testing.B) {
	n := *benchMembers
	var pools []*Pool
	defer func() {
		for _, p := range pools {
			p.Shutdown()
		}
	}()
	start := func(name string, join []string) *Pool {
		p, err := New(Config{Name: name, BindAddr: "127.0.0.1", BindPort: freeport.One(b), Meta: Meta{Role: RoleAgent, Nodes: []string{name}},
			RetryJoin: join, RetryInterval: 200 * time.Millisecond})
		if err != nil {
			b.Fatal(err)
		}
		return p
	}
	first := start("m-0", nil)
	pools = append(pools, first)
	join := []string{fmt.Sprintf("127.0.0.1:%d", first.cfg.BindPort)}
	for i := 1; i < n; i++ {
		pools = append(pools, start(fmt.Sprintf("m-%d", i), join))
	}
	waitUntil(b, fmt.Sprintf("%d members seen by all", n), 2*time.Minute, func() bool {
		for _, p := range pools {
			if len(p.Alive("")) < n {
				return false
			}
		}
		return true
	})
	c0, t0 := cpuTime(), time.Now()
	time.Sleep(20 * time.Second)
	perMember := float64(cpuTime()-c0) / float64(time.Since(t0)) / float64(n)
	b.ReportMetric(perMember*100, "cpu-%-per-member")
	b.Logf("%d members: %.2f%% of a CPU per member at steady state", n, perMember*100)

	b.ResetTimer()
	var total time.Duration
	for i := 0; i < b.N; i++ {
		name := fmt.Sprintf("new-%d", i)
		t := time.Now()
		p := start(name, join)
		waitUntil(b, name+" seen by all", time.Minute, func() bool {
			for _, q := range pools {
				if m, ok := q.Member(name); !ok || m.Status != StatusAlive {
					return false
				}
			}
			return true
		})
		total += time.Since(t)
		pools = append(pools, p)
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms-to-seen-by-all")
	b.Logf("a new member is seen by all %d in %v on average", n, (total / time.Duration(b.N)).Round(time.Millisecond))
}

func waitUntil(b *testing.B, what string, timeout time.Duration, cond func() bool) {
	b.Helper()
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatalf("timed out waiting for %s", what)
		}
	}
}
