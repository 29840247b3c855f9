package containerio

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/logs"
)

func TestAppendLine(t *testing.T) {
	at := time.Date(2024, 1, 2, 3, 4, 5, 6000, time.UTC)
	cases := []struct {
		name    string
		stream  logStream
		tag     logTag
		content string
		want    string
	}{
		{"full stdout", streamStdout, tagFull, "hello", "2024-01-02T03:04:05.000006000Z stdout F hello\n"},
		{"full stderr", streamStderr, tagFull, "oops", "2024-01-02T03:04:05.000006000Z stderr F oops\n"},
		{"partial", streamStdout, tagPartial, "$ ", "2024-01-02T03:04:05.000006000Z stdout P $ \n"},
		{"empty line", streamStdout, tagFull, "", "2024-01-02T03:04:05.000006000Z stdout F \n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(appendLine(nil, at, tc.stream, tc.tag, []byte(tc.content))); got != tc.want {
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func testLogFile(t *testing.T, spec Spec) *logFile {
	t.Helper()
	if spec.LogPath == "" {
		spec.LogPath = filepath.Join(t.TempDir(), "0.log")
	}
	l, err := openLogFile(spec, hclog.New(&hclog.LoggerOptions{Output: testWriter{t}}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}

// logLine is one parsed line of a CRI log file.
type logLine struct{ stream, tag, content string }

// readLogLines parses a CRI log file, checking each timestamp's fixed-width format.
func readLogLines(t *testing.T, path string) []logLine {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var lines []logLine
	for _, l := range strings.SplitAfter(string(b), "\n") {
		if l == "" {
			continue
		}
		parts := strings.SplitN(strings.TrimSuffix(l, "\n"), " ", 4)
		if len(parts) != 4 || !strings.HasSuffix(l, "\n") {
			t.Fatalf("malformed line %q", l)
		}
		ts, err := time.Parse(time.RFC3339Nano, parts[0])
		if err != nil || len(parts[0]) != len("2006-01-02T15:04:05.000000000Z") || time.Since(ts) > time.Minute {
			t.Fatalf("bad timestamp in %q (%v)", l, err)
		}
		lines = append(lines, logLine{parts[1], parts[2], parts[3]})
	}
	return lines
}

func TestRotationKeepsMaxFiles(t *testing.T) {
	const maxFiles = 3
	// Each line is 30 + len(" stdout F line-NN") + 1 = 48 bytes: three fit in 150.
	l := testLogFile(t, Spec{MaxSize: 150, MaxFiles: maxFiles})
	for i := range 40 {
		l.write(streamStdout, tagFull, fmt.Appendf(nil, "line-%02d", i))
	}
	rotated, err := rotatedFiles(l.path)
	if err != nil {
		t.Fatal(err)
	}
	if len(rotated) != maxFiles-1 {
		t.Fatalf("rotated files %v, want %d", rotated, maxFiles-1)
	}
	entries, _ := os.ReadDir(filepath.Dir(l.path))
	if len(entries) != maxFiles {
		t.Fatalf("%d files in the log directory, want %d", len(entries), maxFiles)
	}
	// Oldest rotated file first, then the current one: the newest lines, in order, none missing.
	var got []string
	var paths []string
	for _, r := range rotated {
		paths = append(paths, r.path)
	}
	for _, path := range append(paths, l.path) {
		if st, _ := os.Stat(path); st.Size() > 150 {
			t.Errorf("%s has %d bytes, more than MaxSize", path, st.Size())
		}
		for _, line := range readLogLines(t, path) {
			got = append(got, line.content)
		}
	}
	if len(got) < 7 || got[len(got)-1] != "line-39" {
		t.Fatalf("kept %v, want the newest lines ending in line-39", got)
	}
	first := 40 - len(got)
	for i, c := range got {
		if want := fmt.Sprintf("line-%02d", first+i); c != want {
			t.Fatalf("kept %v: line %d is %q, want %q", got, i, c, want)
		}
	}
}

func TestRotatedFilesOrder(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "1.log")
	want := []string{
		"1.log.20240101-000000",
		"1.log.20240101-000000.2",
		"1.log.20240101-000000.10",
		"1.log.20240101-000001",
	}
	other := []string{"1.log", "11.log.20240101-000000", "1.log.20240101-000000.gz", "1.log.tmp", "1.log.20240101-000000.0"}
	for _, name := range append(slices.Clone(want), other...) {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	rotated, err := rotatedFiles(path)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rotated {
		got = append(got, filepath.Base(r.path))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// TestCRILogFormatNames checks logfile.go's spelled-out CRI names against the CRI API and cri-client's reader.
func TestCRILogFormatNames(t *testing.T) {
	if string(streamStdout) != string(runtimeapi.Stdout) || string(streamStderr) != string(runtimeapi.Stderr) ||
		string(tagFull) != string(runtimeapi.LogTagFull) || string(tagPartial) != string(runtimeapi.LogTagPartial) ||
		rfc3339NanoFixed != logs.RFC3339NanoFixed {
		t.Fatal("containerio's CRI log names differ from k8s.io/cri-api's or cri-client's")
	}
}
