package containerlogs

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

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
