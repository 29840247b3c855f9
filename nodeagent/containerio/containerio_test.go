package containerio

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/cio"
	"k8s.io/cri-client/pkg/logs"

	"github.com/skiff-dev/skiff/nodeagent/containerlogs"
)

// TestMain lets Start spawn the test binary itself as the stdio process.
func TestMain(m *testing.M) {
	RunChildIfAsked()
	os.Exit(m.Run())
}

// startChild runs Start and makes sure the stdio process is gone when the test ends.
func startChild(t *testing.T, spec Spec) (dir string, cfg cio.Config, pid int) {
	t.Helper()
	dir = filepath.Join(t.TempDir(), "io")
	creator, err := Start(dir, spec)
	if err != nil {
		t.Fatal(err)
	}
	taskIO, err := creator("ctr")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, pidName))
	if err != nil {
		t.Fatal(err)
	}
	if pid, err = strconv.Atoi(string(b)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = Stop(dir)
		waitExited(t, pid)
	})
	return dir, taskIO.Config(), pid
}

// waitExited waits until pid is gone; Start reaps its children, so a dead one does not linger as a zombie.
func waitExited(t *testing.T, pid int) {
	t.Helper()
	waitFor(t, 10*time.Second, "the stdio process to exit", func() bool {
		return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
	})
}

// openWriter opens a FIFO's write side as the shim does, once the stdio process reads it.
func openWriter(t testing.TB, path string) *os.File {
	t.Helper()
	var f *os.File
	waitFor(t, 10*time.Second, "a reader of "+path, func() bool {
		var err error
		f, err = os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0)
		if err != nil && !errors.Is(err, syscall.ENXIO) {
			t.Fatal(err)
		}
		return err == nil
	})
	t.Cleanup(func() { f.Close() })
	return f
}

func write(t testing.TB, f *os.File, s string) {
	t.Helper()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}

func TestChild(t *testing.T) {
	cases := []struct {
		name       string
		tty        bool
		wantLines  []logLine
		wantStdout string
		wantStderr string
	}{
		{
			name:       "stdout and stderr",
			wantLines:  []logLine{{"stdout", "P", "prompt$ "}, {"stdout", "F", "out"}, {"stderr", "F", "err"}},
			wantStdout: "prompt$ out\n", wantStderr: "err\n",
		},
		{
			name:       "tty",
			tty:        true,
			wantLines:  []logLine{{"stdout", "P", "prompt$ "}, {"stdout", "F", "out"}},
			wantStdout: "prompt$ out\n",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			logPath := filepath.Join(t.TempDir(), "logs", "c", "0.log")
			_, cfg, pid := startChild(t, Spec{LogPath: logPath, Tty: tc.tty, MaxSize: 1 << 20, MaxFiles: 2})
			if cfg.Terminal != tc.tty || cfg.Stdin != "" || cfg.Stdout == "" || (cfg.Stderr == "") != tc.tty {
				t.Fatalf("config %+v for tty=%v without stdin", cfg, tc.tty)
			}
			stdout := openWriter(t, cfg.Stdout)
			var stderr *os.File
			if !tc.tty {
				stderr = openWriter(t, cfg.Stderr)
			}
			write(t, stdout, "prompt$ ")
			waitFor(t, 5*time.Second, "the prompt in the log", func() bool {
				b, _ := os.ReadFile(logPath)
				return bytes.HasSuffix(b, []byte(" stdout P prompt$ \n"))
			})
			write(t, stdout, "out\n")
			if stderr != nil {
				waitFor(t, 5*time.Second, "stdout in the log", func() bool {
					b, _ := os.ReadFile(logPath)
					return bytes.HasSuffix(b, []byte(" stdout F out\n"))
				})
				write(t, stderr, "err\n")
				stderr.Close()
			}
			// The container is gone once all its outputs are: the process writes what it has and exits.
			stdout.Close()
			waitExited(t, pid)
			if got := readLogLines(t, logPath); !slices.Equal(got, tc.wantLines) {
				t.Fatalf("log %v, want %v", got, tc.wantLines)
			}
			var gotOut, gotErr bytes.Buffer
			if err := containerlogs.ReadLogs(context.Background(), logPath, &logs.LogOptions{}, nil, &gotOut, &gotErr); err != nil {
				t.Fatal(err)
			}
			if gotOut.String() != tc.wantStdout || gotErr.String() != tc.wantStderr {
				t.Fatalf("read stdout %q, stderr %q; want %q, %q", gotOut.String(), gotErr.String(), tc.wantStdout, tc.wantStderr)
			}
		})
	}
}

// The container's stdin sees EOF only after CloseStdin (stdinOnce) and once the attacher has closed too.
func TestChildStdin(t *testing.T) {
	dir, cfg, pid := startChild(t, Spec{LogPath: filepath.Join(t.TempDir(), "0.log"), Stdin: true})
	if cfg.Stdin != filepath.Join(dir, stdinName) {
		t.Fatalf("stdin FIFO %q", cfg.Stdin)
	}
	// The shim's side. Non-blocking, so that a missing writer shows as EOF instead of a hang.
	shim, err := os.OpenFile(cfg.Stdin, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer shim.Close()
	read := func(wait time.Duration) (string, error) {
		t.Helper()
		if err := shim.SetReadDeadline(time.Now().Add(wait)); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 64)
		n, err := shim.Read(b)
		return string(b[:n]), err
	}

	attach, err := OpenStdin(dir)
	if err != nil {
		t.Fatal(err)
	}
	write(t, attach, "hello\n")
	attach.Close()
	if got, err := read(5 * time.Second); got != "hello\n" || err != nil {
		t.Fatalf("read %q, %v; want the attacher's input", got, err)
	}
	if got, err := read(200 * time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read %q, %v after the attacher left; want no EOF while the stdio process holds stdin", got, err)
	}

	attach, err = OpenStdin(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := CloseStdin(dir); err != nil {
		t.Fatal(err)
	}
	write(t, attach, "bye\n")
	if got, err := read(5 * time.Second); got != "bye\n" || err != nil {
		t.Fatalf("read %q, %v; want the second attacher's input", got, err)
	}
	attach.Close()
	waitFor(t, 5*time.Second, "EOF on stdin", func() bool {
		got, err := read(100 * time.Millisecond)
		if got != "" {
			t.Fatalf("read %q after the last attacher", got)
		}
		if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, io.EOF) {
			t.Fatal(err)
		}
		return errors.Is(err, io.EOF)
	})

	// SIGTERM before the shim ever opened the outputs: the process exits.
	if err := Stop(dir); err != nil {
		t.Fatal(err)
	}
	waitExited(t, pid)
	if err := CloseStdin(dir); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("CloseStdin after exit: %v, want ErrNotRunning", err)
	}
}
