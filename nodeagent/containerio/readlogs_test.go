package containerio

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/logs"
)

func TestReadLogs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "0.log")
	file := "" +
		"2024-01-02T03:04:01.000000000Z stdout F one\n" +
		"2024-01-02T03:04:02.000000000Z stderr F two\n" +
		"2024-01-02T03:04:03.000000000Z stdout P thr\n" +
		"2024-01-02T03:04:03.500000000Z stdout F ee\n" +
		"2024-01-02T03:04:04.000000000Z stdout F four\n"
	if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	ptr := func(n int64) *int64 { return &n }
	cases := []struct {
		name             string
		opts             logs.LogOptions
		wantOut, wantErr string
	}{
		{name: "all", wantOut: "one\nthree\nfour\n", wantErr: "two\n"},
		{name: "tail", opts: logs.LogOptions{TailLines: ptr(2)}, wantOut: "ee\nfour\n"},
		{name: "tail zero", opts: logs.LogOptions{TailLines: ptr(0)}},
		{name: "since", opts: logs.LogOptions{Since: time.Date(2024, 1, 2, 3, 4, 2, 500, time.UTC)}, wantOut: "three\nfour\n"},
		{name: "timestamps", opts: logs.LogOptions{Timestamp: true, TailLines: ptr(3)},
			wantOut: "2024-01-02T03:04:03.000000000Z three\n2024-01-02T03:04:04.000000000Z four\n"},
		{name: "limit bytes", opts: logs.LogOptions{LimitBytes: ptr(6)}, wantOut: "one\n", wantErr: "tw"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if err := ReadLogs(context.Background(), path, &tc.opts, nil, &stdout, &stderr); err != nil {
				t.Fatal(err)
			}
			if stdout.String() != tc.wantOut || stderr.String() != tc.wantErr {
				t.Fatalf("stdout %q, stderr %q; want %q, %q", stdout.String(), stderr.String(), tc.wantOut, tc.wantErr)
			}
		})
	}
}

// syncBuffer is a bytes.Buffer that a follower writes to while the test reads it.
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
	out.write(runtimeapi.Stdout, runtimeapi.LogTagFull, []byte("line-00"))
	var running atomic.Bool
	running.Store(true)
	var got syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- ReadLogs(context.Background(), out.path, &logs.LogOptions{Follow: true}, running.Load, &got, &got)
	}()
	var want strings.Builder
	want.WriteString("line-00\n")
	// One line at a time, each seen before the next is written: the follower must not fall two rotations
	// behind, which would lose the file in between (cri-client reopens the log by name).
	for i := 1; i < 10; i++ {
		out.write(runtimeapi.Stdout, runtimeapi.LogTagFull, fmt.Appendf(nil, "line-%02d", i))
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
