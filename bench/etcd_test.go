package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/skiff-dev/skiff/internal/freeport"
)

// etcdCluster is three etcd members on loopback, each with its own data dir.
type etcdCluster struct {
	clients   []*clientv3.Client
	cmds      []*exec.Cmd
	endpoints []string // each member's client URL
}

// startEtcd starts three members with etcd's defaults (fsync on) and returns one client per member.
func startEtcd(t testing.TB) *etcdCluster {
	t.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		t.Skip("etcd not installed (Debian package etcd-server; `make bench` installs it)")
	}
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
		cmd := exec.Command(bin,
			"--name", fmt.Sprintf("e%d", i), "--data-dir", filepath.Join(base, fmt.Sprintf("e%d", i)),
			"--listen-client-urls", client, "--advertise-client-urls", client,
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", "skiff-bench", "--log-level", "error")
		logf, err := os.Create(filepath.Join(base, fmt.Sprintf("e%d.log", i)))
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		ec.cmds = append(ec.cmds, cmd)
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
	for _, cmd := range ec.cmds {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	}
}
