// Package proctest runs real `skiff server` processes on loopback addresses (127.0.0.1, .2, .3, ...) from
// generated HCL files, and drives them through `skiff operator`, as an operator would. The e2e tests and the
// failover benchmark use it. Set SKIFF_BIN to use a prebuilt binary; otherwise it builds one. Set
// SKIFF_KEEP_LOGS to a directory to keep the servers' logs there after a test (they are in its temporary
// directory, removed with it).
package proctest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/internal/freeport"
	"github.com/skiff-dev/skiff/raftnode"
	"github.com/skiff-dev/skiff/raftnode/raftnodetest"
	"github.com/skiff-dev/skiff/server"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// RemoveBuiltBinary deletes the binary Binary built, if it built one. Test mains call it after the tests.
func RemoveBuiltBinary() {
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
}

// Binary returns the binary under test.
func Binary(t testing.TB) string {
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
		out, err := exec.Command("go", "build", "-o", binPath, "github.com/skiff-dev/skiff/cmd/skiff").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

var tokenLine = regexp.MustCompile(`(?m)^\s*token\s*=`)

func randomToken() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// RaftClient is a raw client of the server's Raft port (internal RPC), with the server's own certificate.
func (p *Proc) RaftClient(t testing.TB) *raftnode.Client {
	t.Helper()
	layer, err := server.RaftLayer(p.Dir)
	if err != nil {
		t.Fatal(err)
	}
	return raftnode.NewClient(p.RaftAddr, layer)
}

// Proc is one skiff server process.
type Proc struct {
	Name     string
	IP       string
	Dir      string
	Config   string
	RaftAddr string // where raftnode.Client reaches this server
	// GossipAddr is where agents and servers join this server's gossip pool.
	GossipAddr string
	cmd        *exec.Cmd
	logPath    string
}

// Cluster is a set of server processes that share ports on different loopback addresses.
type Cluster struct {
	t     testing.TB
	bin   string
	Procs []*Proc
	// What every server's HCL shares, for servers Add writes later.
	base   string
	expect int
	joins  []string
	extra  string
}

// NewCluster writes the HCL files of n servers on 127.0.0.1..n that join each other with bootstrap_expect n.
// extraServerHCL is added inside each server block; unless it sets the cluster token, the servers share a
// random one. Every process is killed at cleanup, and on failure the
// tail of each log is printed.
func NewCluster(t testing.TB, n int, extraServerHCL string) *Cluster {
	t.Helper()
	return NewClusterFrom(t, 1, n, extraServerHCL)
}

// NewClusterFrom is NewCluster with servers cp-<first> to cp-<first+n-1> on 127.0.0.<first> onwards: a
// second cluster at other addresses than the first.
func NewClusterFrom(t testing.TB, first, n int, extraServerHCL string) *Cluster {
	t.Helper()
	var ips []string
	for i := first; i < first+n; i++ {
		ips = append(ips, fmt.Sprintf("127.0.0.%d", i))
	}
	ports := freeport.Take(t, ips, 3)
	c := &Cluster{t: t, bin: Binary(t), base: t.TempDir(), expect: n, extra: extraServerHCL}
	for _, ip := range ips {
		c.joins = append(c.joins, fmt.Sprintf("%q", fmt.Sprintf("%s:%d", ip, ports[2])))
	}
	if !tokenLine.MatchString(c.extra) {
		c.extra = fmt.Sprintf("token = %q\n", randomToken()) + c.extra
	}
	for i, ip := range ips {
		c.Procs = append(c.Procs, c.newProc(fmt.Sprintf("cp-%d", first+i), ip, ports))
	}
	t.Cleanup(func() {
		for _, p := range c.Procs {
			c.Kill(p)
		}
		keepLogs(t, c.Procs)
		if t.Failed() {
			for _, p := range c.Procs {
				if data, err := os.ReadFile(p.logPath); err == nil {
					t.Logf("--- %s log (tail) ---\n%s", p.Name, tail(data, 4000))
				}
			}
		}
	})
	return c
}

// Add writes the HCL of one more server, on the loopback address after the last one's, which joins the
// others with the cluster's bootstrap_expect (a replacement, say); Start starts it.
func (c *Cluster) Add() *Proc {
	c.t.Helper()
	last := c.Procs[len(c.Procs)-1]
	var a, b, d, n int
	if _, err := fmt.Sscanf(last.IP, "%d.%d.%d.%d", &a, &b, &d, &n); err != nil {
		c.t.Fatalf("address %s: %v", last.IP, err)
	}
	ip := fmt.Sprintf("%d.%d.%d.%d", a, b, d, n+1)
	var num int
	fmt.Sscanf(last.Name, "cp-%d", &num)
	p := c.newProc(fmt.Sprintf("cp-%d", num+1), ip, freeport.Take(c.t, []string{ip}, 3))
	c.Procs = append(c.Procs, p)
	return p
}

// newProc writes the HCL of server name on ip with ports api, raft and gossip.
func (c *Cluster) newProc(name, ip string, ports []int) *Proc {
	c.t.Helper()
	p := &Proc{Name: name, IP: ip, Dir: filepath.Join(c.base, name)}
	p.Config = filepath.Join(c.base, p.Name+".hcl")
	p.RaftAddr = fmt.Sprintf("%s:%d", ip, ports[1])
	p.GossipAddr = fmt.Sprintf("%s:%d", ip, ports[2])
	p.logPath = filepath.Join(c.base, p.Name+".log")
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
  server_stabilization_time = "2s"
%s
}
`, p.Name, p.Dir, ip, ports[0], ports[1], ports[2], c.expect, strings.Join(c.joins, ", "), c.extra)
	if err := os.WriteFile(p.Config, []byte(hcl), 0o600); err != nil {
		c.t.Fatal(err)
	}
	return p
}

// keepLogs copies the servers' logs into $SKIFF_KEEP_LOGS, when set, as <test>-<server>.log.
func keepLogs(t testing.TB, procs []*Proc) {
	dir := os.Getenv("SKIFF_KEEP_LOGS")
	if dir == "" {
		return
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Logf("keeping the server logs: %v", err)
		return
	}
	prefix := strings.NewReplacer("/", "_", " ", "_").Replace(t.Name())
	for _, p := range procs {
		data, err := os.ReadFile(p.logPath)
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, prefix+"-"+p.Name+".log"), data, 0o644)
		}
		if err != nil {
			t.Logf("keeping %s's log: %v", p.Name, err)
		}
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// Start starts p's server process; its output is appended to its log file.
func (c *Cluster) Start(p *Proc) {
	c.t.Helper()
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		c.t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(c.bin, "server", "-config", p.Config)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	p.cmd = cmd
}

// Kill sends SIGKILL and reaps the process.
func (c *Cluster) Kill(p *Proc) {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	p.cmd.Wait()
	p.cmd = nil
}

// Stop sends SIGTERM and waits for a graceful exit.
func (c *Cluster) Stop(p *Proc) error {
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
		c.Kill(p)
		return fmt.Errorf("%s did not exit within 20s of SIGTERM", p.Name)
	}
}

// Kubeconfig is the admin kubeconfig the server writes.
func (p *Proc) Kubeconfig() string { return filepath.Join(p.Dir, "admin.kubeconfig") }

// PID is the server process's PID (0 when it is not running), for CPU and memory readings.
func (p *Proc) PID() int {
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Operator runs `skiff operator ARGS` against p's kubeconfig, which it names in $KUBECONFIG (a -kubeconfig
// flag would have to go between the command words and the positional arguments).
func (c *Cluster) Operator(p *Proc, args ...string) (string, error) {
	cmd := exec.Command(c.bin, append([]string{"operator"}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+p.Kubeconfig())
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// PeerRow is one row of list-peers.
type PeerRow struct{ Name, ID, Address, State, Voter string }

// ParsePeers reads the table `skiff operator raft list-peers` prints.
func ParsePeers(out string) ([]PeerRow, error) {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) == 0 || strings.Join(strings.Fields(lines[0]), " ") != "NAME ID ADDRESS STATE VOTER" {
		return nil, fmt.Errorf("unexpected list-peers output: %q", out)
	}
	var rows []PeerRow
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if len(f) != 5 {
			return nil, fmt.Errorf("bad row %q", l)
		}
		rows = append(rows, PeerRow{f[0], f[1], f[2], f[3], f[4]})
	}
	return rows, nil
}

// WaitFor polls cond until nil or timeout; it is raftnodetest's, shared by every harness.
func WaitFor(t testing.TB, what string, timeout time.Duration, cond func() error) {
	t.Helper()
	raftnodetest.WaitFor(t, what, timeout, cond)
}

// HealthyPeers waits until list-peers through p shows want voters and exactly one leader, and returns the
// leader's name.
func (c *Cluster) HealthyPeers(p *Proc, want int) string {
	c.t.Helper()
	var leader string
	WaitFor(c.t, "list-peers via "+p.Name+" to show one leader and all voters", 30*time.Second, func() error {
		out, err := c.Operator(p, "raft", "list-peers")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		rows, err := ParsePeers(out)
		if err != nil {
			return err
		}
		leaders, voters := 0, 0
		for _, r := range rows {
			if r.State == "leader" {
				leaders++
				leader = r.Name
			}
			if r.Voter == "true" {
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

// ByName returns the process with the given server name.
func (c *Cluster) ByName(name string) *Proc {
	for _, p := range c.Procs {
		if p.Name == name {
			return p
		}
	}
	c.t.Fatalf("no process %s", name)
	return nil
}
