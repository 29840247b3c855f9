package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd"
	"github.com/hashicorp/go-hclog"
)

// containerdNamespace is the containerd namespace that holds everything the agent creates, so that it never
// touches other users' containers on a shared containerd.
const containerdNamespace = "skiff"

// privateContainerd is a containerd daemon the agent runs, with its root, state and socket under the agent's
// data dir. It is restarted when it dies, and stopped when the agent stops. An agent killed outright leaves
// it running, as a kubelet's death leaves a node's containerd (and k3s's its own): what containerd was doing
// for the agent completes (a task's start cut short would fail the container, and a restartPolicy Never pod
// with it), and the next agent on this data dir adopts it. Its containers' shims outlive it too, so an agent
// restart finds its pods still running.
type privateContainerd struct {
	dir    string
	logger hclog.Logger

	mu   sync.Mutex
	pid  int
	done chan struct{} // closed when the daemon exits
}

// containerdConfig is the daemon's configuration: only the plugins the agent uses (no CRI), everything under
// dir, and the overlayfs snapshotter.
const containerdConfig = `version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing"]

[grpc]
  address = %[3]q

[ttrpc]
  address = "%[3]s.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = %[4]q
`

// maxSocketPath is the longest path a unix socket can be bound at (sun_path is 108 bytes with its NUL).
const maxSocketPath = 107

func (p *privateContainerd) socket() string { return filepath.Join(p.dir, "containerd.sock") }

// start launches the daemon and waits until it answers; the daemon is supervised until ctx ends, when it is
// stopped with SIGTERM (its shims, and so the pods, keep running).
func (p *privateContainerd) start(ctx context.Context) error {
	if err := p.writeConfig(); err != nil {
		return err
	}
	if p.adoptPrevious(ctx) {
		go p.supervise(ctx)
		return nil
	}
	if err := p.launch(); err != nil {
		return err
	}
	if err := waitForContainerd(ctx, p.socket(), 30*time.Second); err != nil {
		p.stop()
		return fmt.Errorf("private containerd did not start (log: %s): %w", filepath.Join(p.dir, "containerd.log"), err)
	}
	go p.supervise(ctx)
	return nil
}

// writeConfig makes the daemon's directory and configuration.
func (p *privateContainerd) writeConfig() error {
	if len(p.socket()) > maxSocketPath {
		return fmt.Errorf("containerd socket path %s is longer than %d bytes; use a shorter data_dir", p.socket(), maxSocketPath)
	}
	if _, err := exec.LookPath("containerd"); err != nil {
		return fmt.Errorf("containerd is not installed (Debian package containerd): %w", err)
	}
	if err := os.MkdirAll(p.dir, 0o711); err != nil {
		return err
	}
	conf := fmt.Sprintf(containerdConfig, filepath.Join(p.dir, "root"), filepath.Join(p.dir, "state"), p.socket(), filepath.Join(p.dir, "opt"))
	return os.WriteFile(filepath.Join(p.dir, "config.toml"), []byte(conf), 0o600)
}

func (p *privateContainerd) launch() error {
	logFile, err := os.OpenFile(filepath.Join(p.dir, "containerd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logFile.Close()
	// A stale socket from a daemon that died would make the new one fail to bind.
	_ = os.Remove(p.socket())
	cmd := exec.Command("containerd", "--config", filepath.Join(p.dir, "config.toml"))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// A session of its own keeps a terminal's Ctrl-C and the agent's process group signals for the agent,
	// which stops the daemon itself; and nothing ties the daemon's life to the agent's (see privateContainerd).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting containerd: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	p.mu.Lock()
	p.pid, p.done = cmd.Process.Pid, done
	p.mu.Unlock()
	return os.WriteFile(p.pidFile(), []byte(strconv.Itoa(cmd.Process.Pid)), 0o600)
}

func (p *privateContainerd) pidFile() string { return filepath.Join(p.dir, "containerd.pid") }

// bundlesDir holds a directory per task of the agent's namespace (containerd's runtime v2 bundles).
func (p *privateContainerd) bundlesDir() string {
	return filepath.Join(p.dir, "state", "io.containerd.runtime.v2.task", containerdNamespace)
}

// previousPid is the daemon that an earlier agent on this data dir started, if it still runs.
func (p *privateContainerd) previousPid() int {
	data, err := os.ReadFile(p.pidFile())
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 || !p.isOurs(pid) {
		return 0
	}
	return pid
}

// isOurs tells whether pid is a live containerd with this data dir's configuration (a pid may be reused).
func (p *privateContainerd) isOurs(pid int) bool {
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(cmdline), filepath.Join(p.dir, "config.toml"))
}

// adoptPrevious takes over the daemon an earlier agent on this data dir left running (it was killed), when
// that daemon answers; one that does not is stopped, as two daemons on one root would fight over it.
func (p *privateContainerd) adoptPrevious(ctx context.Context) bool {
	pid := p.previousPid()
	if pid == 0 {
		return false
	}
	if err := waitForContainerd(ctx, p.socket(), 10*time.Second); err == nil {
		p.logger.Info("adopting the private containerd an earlier agent left running", "pid", pid)
		done := make(chan struct{})
		go func() {
			// Not this process's child: watch for its exit.
			for p.isOurs(pid) {
				time.Sleep(250 * time.Millisecond)
			}
			close(done)
		}()
		p.mu.Lock()
		p.pid, p.done = pid, done
		p.mu.Unlock()
		return true
	}
	p.logger.Warn("stopping the private containerd an earlier agent left, which does not answer", "pid", pid)
	_ = syscall.Kill(pid, syscall.SIGTERM)
	for deadline := time.Now().Add(10 * time.Second); p.isOurs(pid) && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	if p.isOurs(pid) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		for p.isOurs(pid) {
			time.Sleep(50 * time.Millisecond)
		}
	}
	return false
}

// supervise restarts the daemon when it exits, and stops it when ctx ends.
func (p *privateContainerd) supervise(ctx context.Context) {
	for {
		p.mu.Lock()
		done := p.done
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			p.stop()
			return
		case <-done:
		}
		if ctx.Err() != nil {
			return
		}
		p.logger.Warn("private containerd exited; restarting it")
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
		if err := p.launch(); err != nil {
			p.logger.Error("restarting containerd", "error", err)
		}
	}
}

func (p *privateContainerd) stop() {
	p.mu.Lock()
	pid, done := p.pid, p.done
	p.mu.Unlock()
	if pid == 0 {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(pid, syscall.SIGKILL)
		<-done
	}
}

// waitForContainerd polls the socket until the daemon serves its version.
func waitForContainerd(ctx context.Context, socket string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		if _, err := os.Stat(socket); err == nil {
			client, err := containerd.New(socket, containerd.WithTimeout(2*time.Second))
			if err == nil {
				_, err = client.Version(ctx)
				client.Close()
				if err == nil {
					return nil
				}
			}
			last = err
		}
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
