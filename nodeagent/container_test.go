package nodeagent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/errdefs"
	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
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

// TestPrivateContainerdAdopted: a private containerd left running by an agent killed outright is adopted by
// the next agent on the data dir (not stopped and replaced, which would cut short what it was doing), and
// stopped when that agent stops.
func TestPrivateContainerdAdopted(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("containerd needs root")
	}
	if _, err := exec.LookPath("containerd"); err != nil {
		t.Skip("containerd is not installed")
	}
	dir, err := os.MkdirTemp("", "skiff-ctrd-") // short: the socket path must fit in 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	// The killed agent's daemon: launched, with no supervisor left to stop it.
	killed := &privateContainerd{dir: dir, logger: hclog.NewNullLogger()}
	if err := killed.writeConfig(); err != nil {
		t.Fatal(err)
	}
	if err := killed.launch(); err != nil {
		t.Fatal(err)
	}
	defer killed.stop()
	if err := waitForContainerd(context.Background(), killed.socket(), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	ctx, stopAgent := context.WithCancel(context.Background())
	next := &privateContainerd{dir: dir, logger: hclog.NewNullLogger()}
	if err := next.start(ctx); err != nil {
		t.Fatal(err)
	}
	if next.pid != killed.pid {
		t.Fatalf("the next agent runs containerd %d; want the running %d adopted", next.pid, killed.pid)
	}
	stopAgent()
	select {
	case <-killed.done:
	case <-time.After(20 * time.Second):
		t.Fatal("the adopted containerd still runs after its agent stopped")
	}
}

// runtimeClasses is an objectGetter with RuntimeClasses only.
type runtimeClasses struct {
	noObjects
	classes map[string]string // name → handler
}

func (o runtimeClasses) RuntimeClass(ctx context.Context, name string) (*nodev1.RuntimeClass, error) {
	if handler, ok := o.classes[name]; ok {
		return &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Handler: handler}, nil
	}
	return o.noObjects.RuntimeClass(ctx, name)
}

// TestCheckRuntimeHandler: a pod's sandbox is made only for a RuntimeClass whose handler the agent runs
// (runc); a class that is gone or names another handler fails the sync, with the reason, to be retried.
func TestCheckRuntimeHandler(t *testing.T) {
	r := &containerdRuntime{objects: runtimeClasses{classes: map[string]string{"default": "runc", "kata": "kata-qemu"}}}
	for _, tc := range []struct {
		class string // "" for none
		want  string // "" for no error
	}{
		{"", ""},
		{"default", ""},
		{"kata", `no runtime for "kata-qemu" is configured`},
		{"gone", `RuntimeClass "gone": runtimeclasses.node.k8s.io "gone" not found`},
	} {
		pod := &corev1.Pod{}
		if tc.class != "" {
			pod.Spec.RuntimeClassName = &tc.class
		}
		err := r.checkRuntimeHandler(context.Background(), pod)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("class %q: %v; want %q", tc.class, err, tc.want)
		}
	}
}
