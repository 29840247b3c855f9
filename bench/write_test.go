package bench

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/fsm"
	"github.com/skiff-dev/skiff/raftnode"
	rt "github.com/skiff-dev/skiff/raftnode/raftnodetest"
)

// writer performs one 1 KiB write through the member worker is bound to.
type writer func(ctx context.Context, worker int, key string, value []byte) error

// latencies measures ops writes spread over `concurrency` workers.
type latencies struct {
	elapsed time.Duration
	all     []time.Duration
}

func (l latencies) percentile(p int) time.Duration { return l.all[(len(l.all)-1)*p/100] }

func runWrites(b *testing.B, concurrency, ops int, prefix string, w writer) latencies {
	value := make([]byte, 1024)
	for i := range value {
		value[i] = byte('a' + i%26)
	}
	var next atomic.Int64
	lat := make([][]time.Duration, concurrency)
	var wg sync.WaitGroup
	var failed atomic.Value
	start := time.Now()
	for c := 0; c < concurrency; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				seq := int(next.Add(1))
				if seq > ops {
					return
				}
				t0 := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				err := w(ctx, c, fmt.Sprintf("%s%d", prefix, seq), value)
				cancel()
				if err != nil {
					failed.Store(err)
					return
				}
				lat[c] = append(lat[c], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	out := latencies{elapsed: time.Since(start)}
	if err, _ := failed.Load().(error); err != nil {
		b.Fatalf("write failed: %v", err)
	}
	for _, l := range lat {
		out.all = append(out.all, l...)
	}
	sort.Slice(out.all, func(i, j int) bool { return out.all[i] < out.all[j] })
	return out
}

// BenchmarkWrite writes 1 KiB values through three Skiff peers (real TCP, raft-boltdb with fsync,
// production timeouts) and through a three-member etcd cluster from Debian's etcd-server, in the same run,
// at concurrency 1, 16 and 256. Worker i writes through member i%3 in both systems, so followers forward.
// b.N is the number of writes; run with -benchtime=20000x for stable figures.
func BenchmarkWrite(b *testing.B) {
	if firstCallOfTwo(b) {
		return
	}
	etcd := startEtcd(b)
	skiff := rt.TestCluster(b, 3, func(c *raftnode.Config) {
		d := raftnode.DefaultConfig()
		c.HeartbeatTimeout, c.ElectionTimeout, c.LeaderLeaseTimeout = d.HeartbeatTimeout, d.ElectionTimeout, d.LeaderLeaseTimeout
		c.CommitTimeout, c.ApplyTimeout = d.CommitTimeout, d.ApplyTimeout
	})
	systems := []struct {
		name  string
		write writer
	}{
		{"skiff", func(ctx context.Context, worker int, key string, value []byte) error {
			res, err := skiff.Node(worker%3).Apply(ctx, &fsm.Command{Type: fsm.CmdCreate, Key: key, Value: value})
			if err == nil {
				err = res.Err()
			}
			return err
		}},
		{"etcd", func(ctx context.Context, worker int, key string, value []byte) error {
			_, err := etcd.clients[worker%3].Put(ctx, key, string(value))
			return err
		}},
	}
	run := 0
	for _, conc := range []int{1, 16, 256} {
		for _, sys := range systems {
			b.Run(fmt.Sprintf("%s/c=%d", sys.name, conc), func(b *testing.B) {
				run++
				l := runWrites(b, conc, b.N, fmt.Sprintf("/bench/%d/", run), sys.write)
				b.ReportMetric(float64(b.N)/l.elapsed.Seconds(), "writes/s")
				b.ReportMetric(float64(l.percentile(50).Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(l.percentile(99).Microseconds())/1000, "p99-ms")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}
