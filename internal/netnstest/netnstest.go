// Package netnstest gives tests and benchmarks throwaway network namespaces in which the real iptables,
// ipset and conntrack programs run: wrappers that enter the namespace stand in for the programs, so the code
// under test runs them as it would on a host without touching the host's rules.
package netnstest

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Netns is a network namespace that lives until the test's cleanup.
type Netns struct {
	Name string
	dir  string // the wrappers
}

// New makes a namespace named <prefix>-<random> (removed in tb.Cleanup, even on failure), or skips the test
// when not root or when a program it needs is missing.
func New(tb testing.TB, prefix string, needs ...string) *Netns {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root for network namespaces")
	}
	for _, tool := range append([]string{"ip"}, needs...) {
		if _, err := exec.LookPath(tool); err != nil {
			tb.Skipf("%s not installed (make setup installs it)", tool)
		}
	}
	n := &Netns{Name: fmt.Sprintf("%s-%08x", prefix, rand.Uint32()), dir: tb.TempDir()}
	Run(tb, "ip", "netns", "add", n.Name)
	tb.Cleanup(func() { _ = exec.Command("ip", "netns", "del", n.Name).Run() })
	n.Exec(tb, "ip", "link", "set", "lo", "up")
	return n
}

// Wrap returns the path of a script that runs tool inside the namespace with the arguments it is given.
func (n *Netns) Wrap(tb testing.TB, tool string) string {
	tb.Helper()
	path := filepath.Join(n.dir, tool)
	script := fmt.Sprintf("#!/bin/sh\nexec ip netns exec %s %s \"$@\"\n", n.Name, tool)
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		tb.Fatal(err)
	}
	return path
}

// Exec runs a command inside the namespace and returns its output; a failure fails the test.
func (n *Netns) Exec(tb testing.TB, args ...string) string {
	tb.Helper()
	return Run(tb, "ip", append([]string{"netns", "exec", n.Name}, args...)...)
}

// Run runs a command and returns its output; a failure fails the test.
func Run(tb testing.TB, name string, args ...string) string {
	tb.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		tb.Fatalf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}
