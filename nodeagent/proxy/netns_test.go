package proxy

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// testNetns is a throwaway network namespace with wrappers that run iptables, iptables-save,
// iptables-restore and conntrack inside it, so tests use the real programs without touching the host's rules.
type testNetns struct {
	name string
	cmds Commands
}

// newTestNetns makes a namespace named skiffproxy-<random> (removed in t.Cleanup, even on failure), or skips
// the test without root or iptables.
func newTestNetns(tb testing.TB) *testNetns {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root for network namespaces and iptables")
	}
	for _, tool := range []string{"ip", "iptables", "iptables-save", "iptables-restore"} {
		if _, err := exec.LookPath(tool); err != nil {
			tb.Skipf("%s not installed (make setup installs it)", tool)
		}
	}
	ns := &testNetns{name: fmt.Sprintf("skiffproxy-%08x", rand.Uint32())}
	run(tb, "ip", "netns", "add", ns.name)
	tb.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns.name).Run() })
	ns.exec(tb, "ip", "link", "set", "lo", "up")
	dir := tb.TempDir()
	wrap := func(tool string) string {
		path := filepath.Join(dir, tool)
		script := fmt.Sprintf("#!/bin/sh\nexec ip netns exec %s %s \"$@\"\n", ns.name, tool)
		if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
			tb.Fatal(err)
		}
		return path
	}
	ns.cmds = Commands{IPTables: wrap("iptables"), IPTablesSave: wrap("iptables-save"),
		IPTablesRestore: wrap("iptables-restore"), Conntrack: wrap("conntrack")}
	return ns
}

func run(tb testing.TB, name string, args ...string) string {
	tb.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		tb.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

func (ns *testNetns) exec(tb testing.TB, args ...string) string {
	tb.Helper()
	return run(tb, "ip", append([]string{"netns", "exec", ns.name}, args...)...)
}

// save is iptables-save of the namespace, without the comment lines that carry a date.
func (ns *testNetns) save(tb testing.TB) string {
	tb.Helper()
	var keep []string
	for _, line := range strings.Split(ns.exec(tb, "iptables-save"), "\n") {
		if !strings.HasPrefix(line, "#") {
			keep = append(keep, line)
		}
	}
	return strings.Join(keep, "\n")
}

// do runs f on a thread inside the namespace: sockets f opens belong to it. The thread is never returned to
// the Go scheduler (it is locked and ends with the goroutine), so no other goroutine runs in the namespace.
func (ns *testNetns) do(tb testing.TB, f func()) {
	tb.Helper()
	errs := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		fd, err := unix.Open("/run/netns/"+ns.name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err == nil {
			err = unix.Setns(fd, unix.CLONE_NEWNET)
			unix.Close(fd)
		}
		if err == nil {
			f()
		}
		errs <- err
	}()
	if err := <-errs; err != nil {
		tb.Fatalf("entering netns %s: %v", ns.name, err)
	}
}
