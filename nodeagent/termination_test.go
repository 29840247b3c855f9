package nodeagent

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/config"
)

// TestTerminationMessage: the message is what the container wrote to its terminationMessagePath (its first
// 4 KiB); with FallbackToLogsOnError, a failed container that wrote nothing gets the last 80 lines of its log,
// cut to 2 KiB, and one that succeeded gets nothing.
func TestTerminationMessage(t *testing.T) {
	r := &containerdRuntime{cfg: &config.Agent{DataDir: t.TempDir()}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "u1", Name: "p", Namespace: "default"}}
	c := &corev1.Container{Name: "app", TerminationMessagePath: "/dev/termination-log",
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError}
	rec := &ctrRecord{id: "u1-app-0", name: "app", exitCode: 1}

	mounts, err := r.terminationMessageMount(pod, c, rec.id)
	if err != nil || len(mounts) != 1 || mounts[0].Destination != "/dev/termination-log" {
		t.Fatalf("mount %+v, %v", mounts, err)
	}
	if st, err := os.Stat(mounts[0].Source); err != nil || st.Mode().Perm() != 0o666 {
		t.Fatalf("termination file: %v, %v; want mode 0666", st, err)
	}

	// Nothing written: the log's last 80 lines.
	var log strings.Builder
	for i := 1; i <= 100; i++ {
		fmt.Fprintf(&log, "2026-11-27T10:00:00.%09dZ stdout F line %d\n", i, i)
	}
	logPath := r.containerLogPath(pod, c.Name, rec.attempt)
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(logPath, []byte(log.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	got := r.terminationMessage(pod, c, rec)
	if !strings.HasPrefix(got, "line 21\n") || !strings.HasSuffix(got, "line 100\n") {
		t.Errorf("fallback message %q; want lines 21 to 100", got)
	}
	// Longer than 2 KiB: its end.
	long := strings.Repeat("x", 3000)
	if err := os.WriteFile(logPath, []byte("2026-11-27T10:00:00.000000000Z stderr F "+long+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := r.terminationMessage(pod, c, rec); len(got) != terminationLogBytes || !strings.HasSuffix(got, "x\n") {
		t.Errorf("fallback message of %d bytes; want the last %d", len(got), terminationLogBytes)
	}
	// A success falls back to nothing.
	success := &ctrRecord{id: "u1-app-1", name: "app", attempt: 1}
	if _, err := r.terminationMessageMount(pod, c, success.id); err != nil {
		t.Fatal(err)
	}
	if got := r.terminationMessage(pod, c, success); got != "" {
		t.Errorf("message of a success %q; want none", got)
	}

	// Written: the file wins, cut to 4 KiB, and is read once per attempt.
	if err := os.WriteFile(mounts[0].Source, []byte(strings.Repeat("m", 5000)), 0o666); err != nil {
		t.Fatal(err)
	}
	if got := r.terminationMessage(pod, c, rec); len(got) != maxTerminationMessage || got[0] != 'm' {
		t.Errorf("message of %d bytes; want the file's first %d", len(got), maxTerminationMessage)
	}
	_ = os.WriteFile(mounts[0].Source, []byte("changed"), 0o666)
	if got := r.terminationMessage(pod, c, rec); len(got) != maxTerminationMessage {
		t.Errorf("message %q after the file changed; want the attempt's first read kept", got)
	}
	// The File policy never reads the log.
	c.TerminationMessagePolicy = corev1.TerminationMessageReadFile
	failed := &ctrRecord{id: "u1-app-2", name: "app", attempt: 2, exitCode: 1}
	if _, err := r.terminationMessageMount(pod, c, failed.id); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(r.containerLogPath(pod, c.Name, failed.attempt), []byte(log.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := r.terminationMessage(pod, c, failed); got != "" {
		t.Errorf("File policy message %q; want none", got)
	}
}
