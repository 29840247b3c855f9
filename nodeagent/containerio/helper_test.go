package containerio

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// buildHelper builds cmd/skiff-container-io as make build does.
func buildHelper(tb testing.TB) string {
	tb.Helper()
	out := filepath.Join(tb.TempDir(), childArg0)
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", out, "github.com/skiff-dev/skiff/cmd/skiff-container-io")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("go build skiff-container-io: %v\n%s", err, b)
	}
	return out
}

// useHelper makes Start spawn program as the stdio process until the test ends.
func useHelper(tb testing.TB, program string) {
	Helper = program
	tb.Cleanup(func() { Helper = "" })
}

// TestDedicatedHelper runs a container's stdio process as cmd/skiff-container-io: it is that program that
// runs, and the container's lines reach the log.
func TestDedicatedHelper(t *testing.T) {
	useHelper(t, buildHelper(t))
	logPath := filepath.Join(t.TempDir(), "0.log")
	_, cfg, pid := startChild(t, Spec{LogPath: logPath, MaxSize: 1 << 20, MaxFiles: 2})
	if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err != nil || exe != Helper {
		t.Fatalf("the stdio process runs %q (%v), want %q", exe, err, Helper)
	}
	stdout, stderr := openWriter(t, cfg.Stdout), openWriter(t, cfg.Stderr)
	write(t, stdout, "out\n")
	write(t, stderr, "err\n")
	stdout.Close()
	stderr.Close()
	waitExited(t, pid)
	got := readLogLines(t, logPath)
	slices.SortFunc(got, func(a, b logLine) int { return strings.Compare(a.stream, b.stream) })
	if want := []logLine{{"stderr", "F", "err"}, {"stdout", "F", "out"}}; !slices.Equal(got, want) {
		t.Fatalf("log %v, want %v", got, want)
	}
}

// TestHelperBesideTheBinary: skiff-container-io is taken from beside the running binary only when it is an
// executable file there.
func TestHelperBesideTheBinary(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "skiff")
	if got := besideOrSelf(exe); got != exe {
		t.Fatalf("without a helper: %q, want %q", got, exe)
	}
	helper := filepath.Join(dir, childArg0)
	if err := os.WriteFile(helper, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := besideOrSelf(exe); got != exe {
		t.Fatalf("with a helper that is not executable: %q, want %q", got, exe)
	}
	if err := os.Chmod(helper, 0o755); err != nil {
		t.Fatal(err)
	}
	if got := besideOrSelf(exe); got != helper {
		t.Fatalf("with a helper: %q, want %q", got, helper)
	}
}

// BenchmarkStdioProcessMemory measures the resident memory of one container's stdio process once it has
// logged 1,000 lines on each stream (anon-KiB: its own, per container; file-KiB: the program's pages, shared), for cmd/skiff-container-io and, when SKIFF_BIN names a skiff binary, for
// skiff itself as the stdio process (the design before the helper). go test -run '^$' -bench StdioProcess
// ./nodeagent/containerio/
func BenchmarkStdioProcessMemory(b *testing.B) {
	programs := [][2]string{{"helper", buildHelper(b)}}
	if skiff := os.Getenv("SKIFF_BIN"); skiff != "" {
		programs = append(programs, [2]string{"skiff", skiff})
	}
	for _, p := range programs {
		b.Run(p[0], func(b *testing.B) {
			useHelper(b, p[1])
			var anon, file int
			for i := 0; i < b.N; i++ {
				a, f := stdioProcessRSS(b)
				anon, file = anon+a, file+f
			}
			b.ReportMetric(float64(anon)/float64(b.N), "anon-KiB")
			b.ReportMetric(float64(file)/float64(b.N), "file-KiB")
		})
	}
}

// stdioProcessRSS starts a stdio process, logs 1,000 lines on each stream through it, and returns its resident
// memory: anonymous (its own heap and stacks, what each container costs) and file-backed (the program's pages,
// which every stdio process running the same program shares).
func stdioProcessRSS(b *testing.B) (anon, file int) {
	dir := filepath.Join(b.TempDir(), "io")
	creator, err := Start(dir, Spec{LogPath: filepath.Join(dir, "0.log"), MaxSize: 10 << 20, MaxFiles: 5})
	if err != nil {
		b.Fatal(err)
	}
	defer Stop(dir)
	taskIO, err := creator("ctr")
	if err != nil {
		b.Fatal(err)
	}
	cfg := taskIO.Config()
	pidText, err := os.ReadFile(filepath.Join(dir, pidName))
	if err != nil {
		b.Fatal(err)
	}
	stdout, stderr := openWriter(b, cfg.Stdout), openWriter(b, cfg.Stderr)
	for i := 0; i < 1000; i++ {
		write(b, stdout, fmt.Sprintf("line %d of a container's output, about as long as a usual log line\n", i))
		write(b, stderr, fmt.Sprintf("line %d of its errors\n", i))
	}
	waitFor(b, 10*time.Second, "2,000 lines in the log", func() bool {
		data, _ := os.ReadFile(filepath.Join(dir, "0.log"))
		return strings.Count(string(data), "\n") >= 2000
	})
	f, err := os.Open(filepath.Join("/proc", strings.TrimSpace(string(pidText)), "status"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) >= 2 {
			kib, _ := strconv.Atoi(fields[1])
			switch fields[0] {
			case "RssAnon:":
				anon = kib
			case "RssFile:":
				file = kib
			}
		}
	}
	if anon == 0 {
		b.Fatal("no RssAnon in /proc/<pid>/status")
	}
	return anon, file
}
