package proxy

import (
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/skiff-dev/skiff/internal/netnstest"
)

// testNetns is a throwaway network namespace with wrappers that run iptables, iptables-save,
// iptables-restore and conntrack inside it, so tests use the real programs without touching the host's rules.
type testNetns struct {
	name  string
	netns *netnstest.Netns
	cmds  Commands
}

// newTestNetns makes a namespace named skiffproxy-<random> (removed in t.Cleanup, even on failure), or skips
// the test without root or iptables.
func newTestNetns(tb testing.TB) *testNetns {
	tb.Helper()
	n := netnstest.New(tb, "skiffproxy", "iptables", "iptables-save", "iptables-restore")
	return &testNetns{name: n.Name, netns: n, cmds: Commands{IPTables: n.Wrap(tb, "iptables"), IPTablesSave: n.Wrap(tb, "iptables-save"),
		IPTablesRestore: n.Wrap(tb, "iptables-restore"), Conntrack: n.Wrap(tb, "conntrack")}}
}

func run(tb testing.TB, name string, args ...string) string {
	tb.Helper()
	return netnstest.Run(tb, name, args...)
}

func (ns *testNetns) exec(tb testing.TB, args ...string) string {
	tb.Helper()
	return ns.netns.Exec(tb, args...)
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
