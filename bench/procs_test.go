package bench

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
)

// benchProc is a program a benchmark runs beside Skiff (etcd, kube-apiserver, kwok), which it can kill and
// start again with the same arguments, as a machine restarting its services would.
type benchProc struct {
	name, bin string
	args      []string
	log       string // appended to across restarts
	cmd       *exec.Cmd
}

// start starts the process in its own process group, killed with the benchmark if it dies first.
func (p *benchProc) start(tb testing.TB) {
	tb.Helper()
	logf, err := os.OpenFile(p.log, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		tb.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("starting %s: %v", p.name, err)
	}
	p.cmd = cmd
}

// kill sends SIGKILL to the process group and reaps the process; a process not running is left alone.
func (p *benchProc) kill() {
	if p.cmd == nil {
		return
	}
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	p.cmd.Wait()
	p.cmd = nil
}

// pid is the running process's PID, or 0.
func (p *benchProc) pid() int {
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// logTail is the end of the process's log, for a failed benchmark's report.
func (p *benchProc) logTail() string {
	data, _ := os.ReadFile(p.log)
	return string(data[max(0, len(data)-3000):])
}
