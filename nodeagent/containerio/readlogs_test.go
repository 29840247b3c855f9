package containerio

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/cri-client/pkg/logs"

	"github.com/skiff-dev/skiff/nodeagent/containerlogs"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestReadLogsFollowAcrossRotation(t *testing.T) {
	// Three lines per file, as in TestRotationKeepsMaxFiles.
	out := testLogFile(t, Spec{MaxSize: 150, MaxFiles: 2})
	out.write(streamStdout, tagFull, []byte("line-00"))
	var running atomic.Bool
	running.Store(true)
	var got syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- containerlogs.ReadLogs(context.Background(), out.path, &logs.LogOptions{Follow: true}, running.Load, &got, &got)
	}()
	var want strings.Builder
	want.WriteString("line-00\n")
	// One line at a time, each seen before the next is written: the follower must not fall two rotations
	// behind, which would lose the file in between (cri-client reopens the log by name).
	for i := 1; i < 10; i++ {
		out.write(streamStdout, tagFull, fmt.Appendf(nil, "line-%02d", i))
		fmt.Fprintf(&want, "line-%02d\n", i)
		waitFor(t, 5*time.Second, fmt.Sprintf("line-%02d to be followed", i), func() bool {
			return got.String() == want.String()
		})
	}
	if rotated, _ := rotatedFiles(out.path); len(rotated) == 0 {
		t.Fatal("the log never rotated")
	}
	select {
	case err := <-done:
		t.Fatalf("ReadLogs returned while the container runs: %v", err)
	default:
	}
	running.Store(false)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ReadLogs still follows a container that is not running")
	}
	if got.String() != want.String() {
		t.Fatalf("got %q, want %q", got.String(), want.String())
	}
}
