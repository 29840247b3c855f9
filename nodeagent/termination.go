package nodeagent

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/opencontainers/runtime-spec/specs-go"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/cri-client/pkg/logs"

	"github.com/skiff-dev/skiff/nodeagent/containerlogs"
)

// Termination messages, as the kubelet writes them into a terminated container's status: what the container
// wrote to its terminationMessagePath, or, with terminationMessagePolicy FallbackToLogsOnError, the tail of its
// log when it failed and wrote nothing there.
const (
	// maxTerminationMessage is how much of the file the status carries (the kubelet's 4 KiB).
	maxTerminationMessage = 4096
	// The log fallback: the last 80 lines, at most their last 2 KiB (kubecontainer's limits).
	terminationLogLines = 80
	terminationLogBytes = 2048
)

// terminationMessageFile is the host file an attempt's terminationMessagePath is bound to.
func (r *containerdRuntime) terminationMessageFile(pod *corev1.Pod, id string) string {
	return filepath.Join(r.podDir(pod), "termination", id)
}

// terminationMessageMount creates the attempt's (empty) termination message file, writable by any user as the
// container may run as any, and returns its bind mount at c.TerminationMessagePath; none when the path is empty.
func (r *containerdRuntime) terminationMessageMount(pod *corev1.Pod, c *corev1.Container, id string) ([]specs.Mount, error) {
	if c.TerminationMessagePath == "" {
		return nil, nil
	}
	file := r.terminationMessageFile(pod, id)
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(file, nil, 0o666); err != nil {
		return nil, err
	}
	if err := os.Chmod(file, 0o666); err != nil { // past the umask
		return nil, err
	}
	return []specs.Mount{{Destination: c.TerminationMessagePath, Type: "bind", Source: file, Options: []string{"rbind", "rw"}}}, nil
}

// terminationMessage is the message of an exited attempt rec of container c. The file is complete once the
// attempt exited, so what it gives is read once per attempt; the log tail is not kept, as the stdio process
// may still be writing the attempt's last lines when its exit is seen.
func (r *containerdRuntime) terminationMessage(pod *corev1.Pod, c *corev1.Container, rec *ctrRecord) string {
	if msg, ok := r.terminationMessages.Load(rec.id); ok {
		return msg.(string)
	}
	msg := readPrefix(r.terminationMessageFile(pod, rec.id), maxTerminationMessage)
	if msg == "" && c.TerminationMessagePolicy == corev1.TerminationMessageFallbackToLogsOnError && rec.exitCode != 0 {
		return lastLogLines(r.containerLogPath(pod, c.Name, rec.attempt))
	}
	r.terminationMessages.Store(rec.id, msg)
	return msg
}

// readPrefix returns up to limit bytes from the start of file; "" when it cannot be read.
func readPrefix(file string, limit int64) string {
	f, err := os.Open(file)
	if err != nil {
		return ""
	}
	defer f.Close()
	b, _ := io.ReadAll(io.LimitReader(f, limit))
	return string(b)
}

// lastLogLines returns the last terminationLogLines lines of the CRI log at path, stdout and stderr in the
// order written, cut to their last terminationLogBytes bytes.
func lastLogLines(path string) string {
	lines := int64(terminationLogLines)
	var buf bytes.Buffer
	opts := &logs.LogOptions{TailLines: &lines}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = containerlogs.ReadLogs(ctx, path, opts, func() bool { return false }, &buf, &buf)
	b := buf.Bytes()
	if len(b) > terminationLogBytes {
		b = b[len(b)-terminationLogBytes:]
	}
	return string(b)
}
