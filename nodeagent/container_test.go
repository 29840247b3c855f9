package nodeagent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/containerd/containerd/errdefs"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestTaskLeftOver: a task create is retried after clearing what a killed agent left, whether containerd says
// AlreadyExists (a task it knows) or its shim fails to make the bundle directory (a create it never finished,
// which containerd 1.6 reports with no code); other errors are not.
func TestTaskLeftOver(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{fmt.Errorf("creating task: %w", errdefs.ErrAlreadyExists), true},
		{errors.New("failed to start shim: mkdir /data/containerd/state/io.containerd.runtime.v2.task/skiff/abc-app-once-0: file exists: unknown"), true},
		{errors.New("failed to create shim task: OCI runtime create failed: exec: \"nope\": executable file not found in $PATH"), false},
	} {
		if got := taskLeftOver(tc.err); got != tc.want {
			t.Errorf("taskLeftOver(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestPodDNSFilesExist: a sandbox found running after an agent's restart gets its pod's DNS files written
// again when any is missing (the agent was killed before writing them).
func TestPodDNSFilesExist(t *testing.T) {
	dir := t.TempDir()
	if podDNSFilesExist(dir) {
		t.Fatal("an empty pod dir has the DNS files")
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"}}
	if err := writePodDNSFiles(dir, pod, "10.42.0.5", "p", clusterDNS{}); err != nil {
		t.Fatal(err)
	}
	if !podDNSFilesExist(dir) {
		t.Fatal("the DNS files just written are missing")
	}
	if err := os.Remove(filepath.Join(dir, "etc-hosts")); err != nil {
		t.Fatal(err)
	}
	if podDNSFilesExist(dir) {
		t.Fatal("etc-hosts removed, yet all DNS files exist")
	}
}

// TestNetnsPin: what a killed agent leaves of a network namespace pin (a plain file never mounted, a pin
// mounted twice) is told apart from a pin and removed, so that the sandbox can be made again.
func TestNetnsPin(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root")
	}
	path := filepath.Join(t.TempDir(), "netns")
	if isNetnsPin(path) {
		t.Fatal("nothing at the path, yet a pin")
	}
	if err := os.WriteFile(path, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	if isNetnsPin(path) {
		t.Fatal("a plain file is taken for a pin")
	}
	for range 2 { // the second pin replaces the first rather than stacking on it
		if err := pinNetns("/proc/self/ns/net", path); err != nil {
			t.Fatal(err)
		}
		if !isNetnsPin(path) {
			t.Fatal("a pinned namespace is not a pin")
		}
	}
	// Mounted twice by hand, as a pin cut short and retried by an older agent could be.
	if err := unix.Mount("/proc/self/ns/net", path, "none", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	if err := unpinNetns(path); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the pin is still there after unpinning: %v", err)
	}
}
