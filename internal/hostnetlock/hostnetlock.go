// Package hostnetlock lets tests that run a real agent in this machine's own network namespace take turns,
// across test processes: such agents share the agent endpoint's port (10250), the default pod CIDR and its
// bridge, and the host's iptables, which some tests count before and after. `make test` runs the e2e tests
// and the benchmark smoke side by side in separate processes, so an in-process mutex is not enough.
//
// The lock is flock(2) on a file under /run/lock: the kernel releases it when the holder closes it or exits,
// however it exits, so a killed test run leaves no stale lock. Two opens of the file in one process conflict
// as two processes do (flock locks belong to the open file), so tests of one package take turns too.
package hostnetlock

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Path is the lock file.
const Path = "/run/lock/skiff-tests-host-network.lock"

// Lock blocks until the caller holds the host network, and releases it at the test's cleanup. Call it before
// the test registers any cleanup of its own: cleanups run last in, first out, so the lock is released only
// after the test's agent is torn down.
func Lock(tb testing.TB) {
	tb.Helper()
	if err := os.MkdirAll(filepath.Dir(Path), 0o755); err != nil {
		tb.Fatal(err)
	}
	f, err := os.OpenFile(Path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		tb.Fatal(err)
	}
	asked := time.Now()
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		f.Close()
		tb.Fatal(fmt.Errorf("locking %s: %w", Path, err))
	}
	got := time.Now()
	tb.Cleanup(func() {
		f.Close() // closing the only descriptor of the open file releases the lock
		// To stderr, which go test passes through whatever the outcome: the turns' lengths, in every log.
		fmt.Fprintf(os.Stderr, "hostnetlock: %s waited %.0f s for the host network and held it %.0f s\n",
			tb.Name(), got.Sub(asked).Seconds(), time.Since(got).Seconds())
	})
}
