package e2e

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// skiffBin returns the binary under test.
func skiffBin(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("SKIFF_BIN"); p != "" {
		abs, err := filepath.Abs(p)
		if err != nil {
			t.Fatal(err)
		}
		return abs
	}
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "skiff-e2e-bin-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "skiff")
		out, err := exec.Command("go", "build", "-o", binPath, "../cmd/skiff").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

// commonFreePorts finds n ports free for TCP and UDP on every one of ips.
func commonFreePorts(t testing.TB, ips []string, n int) []int {
	t.Helper()
	var ports []int
	for len(ports) < n {
		ln, err := net.Listen("tcp", ips[0]+":0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		ok := true
		for _, ip := range ips {
			addr := fmt.Sprintf("%s:%d", ip, port)
			l, err1 := net.Listen("tcp", addr)
			u, err2 := net.ListenPacket("udp", addr)
			if l != nil {
				l.Close()
			}
			if u != nil {
				u.Close()
			}
			ok = ok && err1 == nil && err2 == nil
		}
		if ok {
			ports = append(ports, port)
		}
	}
	return ports
}

// proc is one skiff server process.
type proc struct {
	name    string
	ip      string
	dir     string
	config  string
	cmd     *exec.Cmd
	logPath string
}

// cluster is a set of server processes that share ports on different loopback addresses.
type cluster struct {
	t     testing.TB
	bin   string
	procs []*proc
}

func newCluster(t testing.TB, n int) *cluster {
	t.Helper()
	var ips []string
	for i := 1; i <= n; i++ {
		ips = append(ips, fmt.Sprintf("127.0.0.%d", i))
	}
	ports := commonFreePorts(t, ips, 3)
	var joins []string
	for _, ip := range ips {
		joins = append(joins, fmt.Sprintf("%q", fmt.Sprintf("%s:%d", ip, ports[2])))
	}
	c := &cluster{t: t, bin: skiffBin(t)}
	base := t.TempDir()
	for i, ip := range ips {
		p := &proc{name: fmt.Sprintf("cp-%d", i+1), ip: ip, dir: filepath.Join(base, fmt.Sprintf("cp-%d", i+1))}
		p.config = filepath.Join(base, p.name+".hcl")
		p.logPath = filepath.Join(base, p.name+".log")
		hcl := fmt.Sprintf(`name      = %q
data_dir  = %q
bind_addr = %q
log_level = "info"
ports {
  api    = %d
  raft   = %d
  gossip = %d
}
server {
  bootstrap_expect = %d
  retry_join       = [%s]
  retry_interval   = "200ms"
}
`, p.name, p.dir, ip, ports[0], ports[1], ports[2], n, strings.Join(joins, ", "))
		if err := os.WriteFile(p.config, []byte(hcl), 0o600); err != nil {
			t.Fatal(err)
		}
		c.procs = append(c.procs, p)
	}
	t.Cleanup(func() {
		for _, p := range c.procs {
			c.kill(p)
		}
		if t.Failed() {
			for _, p := range c.procs {
				if data, err := os.ReadFile(p.logPath); err == nil {
					t.Logf("--- %s log (tail) ---\n%s", p.name, tail(data, 4000))
				}
			}
		}
	})
	return c
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

func (c *cluster) start(p *proc) {
	c.t.Helper()
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		c.t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(c.bin, "server", "-config", p.config)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	p.cmd = cmd
}

// kill sends SIGKILL and reaps the process.
func (c *cluster) kill(p *proc) {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	p.cmd.Wait()
	p.cmd = nil
}

// stop sends SIGTERM and waits for a graceful exit.
func (c *cluster) stop(p *proc) error {
	if p.cmd == nil {
		return nil
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		p.cmd = nil
		return err
	case <-time.After(20 * time.Second):
		c.kill(p)
		return fmt.Errorf("%s did not exit within 20s of SIGTERM", p.name)
	}
}

func (p *proc) kubeconfig() string { return filepath.Join(p.dir, "admin.kubeconfig") }

// operator runs `skiff operator ARGS` against p's kubeconfig.
func (c *cluster) operator(p *proc, args ...string) (string, error) {
	full := append([]string{"operator"}, args...)
	full = append(full[:len(args)+1:len(args)+1], "-kubeconfig", p.kubeconfig())
	// Flags go after the subcommand words but before positional arguments; list-peers and members take none.
	cmd := exec.Command(c.bin, full...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// peerRow is one row of list-peers.
type peerRow struct{ name, id, address, state, voter string }

func parsePeers(out string) ([]peerRow, error) {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) == 0 || strings.Join(strings.Fields(lines[0]), " ") != "NAME ID ADDRESS STATE VOTER" {
		return nil, fmt.Errorf("unexpected list-peers output: %q", out)
	}
	var rows []peerRow
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if len(f) != 5 {
			return nil, fmt.Errorf("bad row %q", l)
		}
		rows = append(rows, peerRow{f[0], f[1], f[2], f[3], f[4]})
	}
	return rows, nil
}

// waitFor polls cond until nil or timeout.
func waitFor(t testing.TB, what string, timeout time.Duration, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: %v", what, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// healthyPeers waits until list-peers through p shows want voters and exactly one leader, and returns the
// leader's name.
func (c *cluster) healthyPeers(p *proc, want int) string {
	c.t.Helper()
	var leader string
	waitFor(c.t, "list-peers via "+p.name+" to show one leader and all voters", 30*time.Second, func() error {
		out, err := c.operator(p, "raft", "list-peers")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		rows, err := parsePeers(out)
		if err != nil {
			return err
		}
		leaders, voters := 0, 0
		for _, r := range rows {
			if r.state == "leader" {
				leaders++
				leader = r.name
			}
			if r.voter == "true" {
				voters++
			}
		}
		if leaders != 1 || voters != want {
			return fmt.Errorf("%d leaders, %d voters:\n%s", leaders, voters, out)
		}
		return nil
	})
	return leader
}

func (c *cluster) byName(name string) *proc {
	for _, p := range c.procs {
		if p.name == name {
			return p
		}
	}
	c.t.Fatalf("no process %s", name)
	return nil
}
