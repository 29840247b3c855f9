package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/fsm"
	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/raftnode"
)

// BenchmarkFailover measures, on three real `skiff server` processes with the default timeouts, the time
// from kill -9 of the leader to the first write acknowledged through a surviving peer. Each iteration is one
// trial: kill the leader, write until acknowledged, restart the killed server and wait until all three are
// voters again. Run with -benchtime=20x for the p50 and p99 over 20 trials.
func BenchmarkFailover(b *testing.B) {
	if firstCallOfTwo(b) {
		return
	}
	c := proctest.NewCluster(b, 3, "")
	for _, p := range c.Procs {
		c.Start(p)
	}
	first := c.Procs[0]
	proctest.WaitFor(b, "admin kubeconfig", 30*time.Second, func() error {
		_, err := os.Stat(first.Kubeconfig())
		return err
	})
	leader := c.HealthyPeers(first, 3)
	var samples []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		victim := c.ByName(leader)
		var survivor *proctest.Proc
		for _, p := range c.Procs {
			if p != victim {
				survivor = p
				break
			}
		}
		client := survivor.RaftClient(b)
		// Warm the connection so the measurement does not include a dial.
		if _, err := writeOnce(client, fmt.Sprintf("/bench/failover/warm-%d", i)); err != nil {
			b.Fatalf("write before the kill: %v", err)
		}
		killed := time.Now()
		c.Kill(victim)
		elapsed, err := writeUntilAcked(client, fmt.Sprintf("/bench/failover/%d", i), killed)
		client.Close()
		if err != nil {
			b.Fatalf("trial %d: %v", i, err)
		}
		samples = append(samples, elapsed)
		c.Start(victim)
		// Ask through the restarted server, so the next trial starts with all three up.
		leader = c.HealthyPeers(victim, 3)
	}
	b.StopTimer()
	sort.Slice(samples, func(i, j int) bool { return samples[i] < samples[j] })
	b.ReportMetric(float64(samples[(len(samples)-1)/2].Milliseconds()), "p50-ms")
	b.ReportMetric(float64(samples[(len(samples)-1)*99/100].Milliseconds()), "p99-ms")
	b.ReportMetric(float64(samples[len(samples)-1].Milliseconds()), "max-ms")
	b.ReportMetric(0, "ns/op")
}

func writeOnce(c *raftnode.Client, key string) (fsm.Result, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	return c.Apply(ctx, &fsm.Command{Type: fsm.CmdCreate, Key: key, Value: []byte("x")})
}

// writeUntilAcked retries a create until one is acknowledged. A retry after an unknown outcome may find the
// key already created by the earlier attempt: that attempt was acknowledged by the cluster, so it counts.
func writeUntilAcked(c *raftnode.Client, key string, since time.Time) (time.Duration, error) {
	for time.Since(since) < 60*time.Second {
		res, err := writeOnce(c, key)
		if err == nil && (res.Err() == nil || errors.Is(res.Err(), fsm.ErrAlreadyExists)) {
			return time.Since(since), nil
		}
		time.Sleep(time.Millisecond)
	}
	return 0, errors.New("no write acknowledged within 60s of the kill")
}
