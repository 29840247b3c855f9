package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/skiff-dev/skiff/internal/freeport"
)

// etcdCluster is three etcd members on loopback, each with its own data dir.
type etcdCluster struct {
	clients   []*clientv3.Client
	members   []*benchProc
	endpoints []string // each member's client URL
}

// etcdMain is etcd's own entry point, which the etcd binary's main calls.
const etcdMain = `package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
`

// etcdBinary builds etcd v3.7.2, the release Kubernetes 1.37 runs on, from its module (benchBuild).
func etcdBinary(b *testing.B) string {
	return benchBuild(b, buildSpec{name: "etcd-v3.7.2", gets: []string{"go.etcd.io/etcd/server/v3@v3.7.2"}, main: etcdMain})
}

// startEtcd starts three members of etcd 3.7 with etcd's defaults (fsync on) and returns one client per
// member.
func startEtcd(b *testing.B) *etcdCluster {
	t := b
	t.Helper()
	bin := etcdBinary(b)
	ports := freeport.Take(t, []string{"127.0.0.1"}, 6)
	var initial []string
	for i := 0; i < 3; i++ {
		initial = append(initial, fmt.Sprintf("e%d=http://127.0.0.1:%d", i, ports[2*i+1]))
	}
	ec := &etcdCluster{}
	base := t.TempDir()
	t.Cleanup(ec.stop)
	for i := 0; i < 3; i++ {
		client := fmt.Sprintf("http://127.0.0.1:%d", ports[2*i])
		peer := fmt.Sprintf("http://127.0.0.1:%d", ports[2*i+1])
		m := &benchProc{name: fmt.Sprintf("etcd e%d", i), bin: bin, log: filepath.Join(base, fmt.Sprintf("e%d.log", i)), args: []string{
			"--name", fmt.Sprintf("e%d", i), "--data-dir", filepath.Join(base, fmt.Sprintf("e%d", i)),
			"--listen-client-urls", client, "--advertise-client-urls", client,
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", "skiff-bench", "--log-level", "error"}}
		m.start(t)
		ec.members = append(ec.members, m)
		ec.endpoints = append(ec.endpoints, client)
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{client}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			t.Fatal(err)
		}
		ec.clients = append(ec.clients, c)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := ec.clients[0].Put(ctx, "/bench/ready", "1")
		cancel()
		if err == nil {
			return ec
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd cluster did not become ready: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (ec *etcdCluster) stop() {
	for _, c := range ec.clients {
		c.Close()
	}
	for _, m := range ec.members {
		m.kill()
	}
}
