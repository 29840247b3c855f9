package bench

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/skiff-dev/skiff/internal/proctest"
)

var profileDir = flag.String("bench.profile-dir", "", "if set, write a CPU profile of each server, taken while the measured phase runs, into this directory")

// profileServers starts CPU profiles of every server (the library's /debug/pprof endpoint) for the given
// duration and returns a function that waits for them and writes them as <dir>/<name>-server-<i>.pprof. It
// does nothing without -bench.profile-dir.
func profileServers(b *testing.B, clients []kubernetes.Interface, name string, d time.Duration) (wait func()) {
	if *profileDir == "" {
		return func() {}
	}
	if err := os.MkdirAll(*profileDir, 0o755); err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	for i, client := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			data, err := client.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").
				Param("seconds", strconv.Itoa(int(d.Seconds()))).Timeout(d + 30*time.Second).DoRaw(context.Background())
			if err != nil {
				b.Logf("profile of server %d: %v", i+1, err)
				return
			}
			path := filepath.Join(*profileDir, fmt.Sprintf("%s-server-%d.pprof", name, i+1))
			if err := os.WriteFile(path, data, 0o644); err != nil {
				b.Logf("profile of server %d: %v", i+1, err)
			}
		}()
	}
	return wg.Wait
}

// heapProfiles writes every server's heap profile (in use, after a GC) as <dir>/<name>-heap-server-<i>.pprof;
// it does nothing without -bench.profile-dir.
func heapProfiles(b *testing.B, clients []kubernetes.Interface, name string) {
	if *profileDir == "" {
		return
	}
	if err := os.MkdirAll(*profileDir, 0o755); err != nil {
		b.Fatal(err)
	}
	for i, client := range clients {
		data, err := client.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/heap").Param("gc", "1").
			Timeout(time.Minute).DoRaw(context.Background())
		if err != nil {
			b.Logf("heap profile of server %d: %v", i+1, err)
			continue
		}
		path := filepath.Join(*profileDir, fmt.Sprintf("%s-heap-server-%d.pprof", name, i+1))
		if err := os.WriteFile(path, data, 0o644); err != nil {
			b.Logf("heap profile of server %d: %v", i+1, err)
		}
	}
}

// cpuMeter reads the CPU time used by the benchmark process (the clients) and by the servers, so that a
// phase's cost per operation can be reported beside its rate.
type cpuMeter struct {
	b       *testing.B
	pids    []int
	client  int64 // ticks at start
	servers int64
}

func startCPU(b *testing.B, c *proctest.Cluster) *cpuMeter { return startCPUOf(b, clusterPIDs(c)) }

// startCPUOf meters the CPU of the given server processes and of the benchmark's own.
func startCPUOf(b *testing.B, pids []int) *cpuMeter {
	m := &cpuMeter{b: b, pids: pids}
	m.client, m.servers = m.read()
	return m
}

// clusterPIDs are the process IDs of a cluster's servers.
func clusterPIDs(c *proctest.Cluster) []int {
	var pids []int
	for _, p := range c.Procs {
		pids = append(pids, p.PID())
	}
	return pids
}

func (m *cpuMeter) read() (client, servers int64) {
	client, err := cpuTicks(os.Getpid())
	if err != nil {
		m.b.Fatal(err)
	}
	for _, pid := range m.pids {
		t, err := cpuTicks(pid)
		if err != nil {
			m.b.Fatal(err)
		}
		servers += t
	}
	return client, servers
}

// perOp returns the client's and the servers' CPU milliseconds per operation since the meter started.
func (m *cpuMeter) perOp(ops int) (clientMs, serversMs float64) {
	client, servers := m.read()
	return float64(client-m.client) * 10 / float64(ops), float64(servers-m.servers) * 10 / float64(ops)
}
