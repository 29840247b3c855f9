package containerio

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/containerd/cio"
)

// Spec says what the stdio process does with a container's streams.
type Spec struct {
	// LogPath is the CRI log file, e.g. <pod dir>/logs/<container>/<attempt>.log.
	LogPath string `json:"logPath"`
	// MaxSize rotates LogPath before a line would take it past this many bytes; 0 never rotates.
	MaxSize int64 `json:"maxSize,omitempty"`
	// MaxFiles is how many files to keep, LogPath included; below 1 counts as 1.
	MaxFiles int `json:"maxFiles,omitempty"`
	// Tty: the container has a terminal, whose one output is stdout.
	Tty bool `json:"tty,omitempty"`
	// Stdin: the container reads stdin, which attach writes to.
	Stdin bool `json:"stdin,omitempty"`
}

// Names in the directory given to Start. The output FIFOs are named after their CRI streams.
const (
	envDir    = "SKIFF_CONTAINER_IO"
	specName  = "spec.json"
	pidName   = "pid"
	stdinName = "stdin"
	logName   = "io.log" // the stdio process's own errors
	// childArg0 names the process in ps, and the helper binary; its argv[1] is the directory, which
	// signalChild checks.
	childArg0 = "skiff-container-io"
	// readyTimeout bounds the child's start: it only reads a file and opens two.
	readyTimeout = 10 * time.Second
)

// Start makes dir, a directory for this container alone, with the container's FIFOs, and spawns the stdio
// process, which outlives this one. It returns once that process holds stdin and the log file. The Creator is
// for NewTask: it hands the shim the FIFO paths, and its IO's Close, Cancel and Wait do nothing, so that
// nothing the container needs depends on the agent.
func Start(dir string, spec Spec) (cio.Creator, error) {
	if spec.LogPath == "" {
		return nil, errors.New("containerio: no log path")
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if spec.LogPath, err = filepath.Abs(spec.LogPath); err != nil {
		return nil, err
	}
	// A stdio process of an earlier Start of this directory (an agent killed before its container started)
	// would be orphaned by the new one, which takes over the pid file.
	_ = Stop(dir)
	cfg, err := prepare(dir, spec)
	if err != nil {
		return nil, err
	}
	if err := spawn(dir); err != nil {
		return nil, err
	}
	return func(string) (cio.IO, error) { return detachedIO{cfg}, nil }, nil
}

// prepare fills dir with the FIFOs and spec.json, replacing those of an earlier Start. It returns the FIFO
// paths for the shim.
func prepare(dir string, spec Spec) (cio.Config, error) {
	cfg := cio.Config{Terminal: spec.Tty, Stdout: filepath.Join(dir, string(streamStdout))}
	if !spec.Tty {
		cfg.Stderr = filepath.Join(dir, string(streamStderr))
	}
	if spec.Stdin {
		cfg.Stdin = filepath.Join(dir, stdinName)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return cfg, err
	}
	for _, name := range []string{stdinName, string(streamStdout), string(streamStderr), specName, pidName} {
		if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return cfg, err
		}
	}
	if err := os.MkdirAll(filepath.Dir(spec.LogPath), 0o755); err != nil {
		return cfg, err
	}
	for _, p := range []string{cfg.Stdin, cfg.Stdout, cfg.Stderr} {
		if p == "" {
			continue
		}
		if err := syscall.Mkfifo(p, 0o600); err != nil {
			return cfg, fmt.Errorf("mkfifo %s: %w", p, err)
		}
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return cfg, err
	}
	return cfg, os.WriteFile(filepath.Join(dir, specName), b, 0o600)
}

// spawn starts the stdio process in its own session, so that it survives the agent and the agent's process
// group signals, writes its pid file, and waits until it holds stdin and the log file.
func spawn(dir string) error {
	exe, err := helperPath()
	if err != nil {
		return err
	}
	errLog, err := os.OpenFile(filepath.Join(dir, logName), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer errLog.Close()
	readyR, readyW, err := os.Pipe()
	if err != nil {
		return err
	}
	defer readyR.Close()
	// exec.Cmd passes on only Stdin, Stdout, Stderr and ExtraFiles; every other descriptor of the agent is
	// close-on-exec.
	cmd := &exec.Cmd{
		Path:        exe,
		Args:        []string{childArg0, dir},
		Env:         append(os.Environ(), envDir+"="+dir),
		Dir:         "/",
		Stdout:      errLog,
		Stderr:      errLog,
		ExtraFiles:  []*os.File{readyW}, // readyFD
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	err = cmd.Start()
	readyW.Close()
	if err != nil {
		return err
	}
	// Reap it if it ends while the agent lives; after the agent, init does.
	go func() { _ = cmd.Wait() }()
	if err := waitReady(readyR); err != nil {
		_ = cmd.Process.Kill()
		return fmt.Errorf("container io process (see %s): %w", filepath.Join(dir, logName), err)
	}
	return os.WriteFile(filepath.Join(dir, pidName), []byte(strconv.Itoa(cmd.Process.Pid)), 0o600)
}

// Helper, when set, is the program spawn runs as the stdio process (tests set it).
var Helper string

// helperPath is the stdio process's program: Helper; else skiff-container-io beside the running binary (make
// build and the package put it there), a small program of its own; else the running binary, which becomes
// the stdio process in RunChildIfAsked (a test binary, or a skiff built without its helper).
func helperPath() (string, error) {
	if Helper != "" {
		return Helper, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	return besideOrSelf(exe), nil
}

// besideOrSelf is the executable skiff-container-io in exe's directory, or exe.
func besideOrSelf(exe string) string {
	beside := filepath.Join(filepath.Dir(exe), childArg0)
	if st, err := os.Stat(beside); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
		return beside
	}
	return exe
}

func waitReady(r *os.File) error {
	if err := r.SetReadDeadline(time.Now().Add(readyTimeout)); err != nil {
		return err
	}
	if _, err := r.Read(make([]byte, 1)); err != nil {
		// EOF: it exited before it was ready.
		return fmt.Errorf("not ready: %w", err)
	}
	return nil
}

// detachedIO gives the shim the FIFO paths and owns nothing: the stdio process holds the other ends.
type detachedIO struct{ cfg cio.Config }

func (d detachedIO) Config() cio.Config { return d.cfg }
func (detachedIO) Cancel()              {}
func (detachedIO) Wait()                {}
func (detachedIO) Close() error         { return nil }

// OpenStdin opens the container's stdin for an attach. Close the writer when the attach ends; the container
// sees EOF only once the stdio process has let go too (CloseStdin).
func OpenStdin(dir string) (*os.File, error) {
	// O_NONBLOCK: fail (ENXIO) rather than hang when nothing reads it any more. Writes still wait for room,
	// in Go's poller.
	return os.OpenFile(filepath.Join(dir, stdinName), os.O_WRONLY|syscall.O_NONBLOCK, 0)
}

// CloseStdin makes the stdio process let go of the container's stdin (stdinOnce: after the first attach).
func CloseStdin(dir string) error { return signalChild(dir, syscall.SIGUSR1) }

// Stop makes the stdio process write what it holds and exit, for a container whose task will not run.
func Stop(dir string) error { return signalChild(dir, syscall.SIGTERM) }

// StopAllUnder stops every stdio process whose directory is under root (a node's teardown).
func StopAllUnder(root string) {
	root = filepath.Clean(root) + "/"
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
		if len(args) == 2 && args[0] == childArg0 && strings.HasPrefix(args[1], root) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// ErrNotRunning is returned when the stdio process of a directory is gone.
var ErrNotRunning = errors.New("container io process not running")

// signalChild sends sig to the stdio process of dir, after checking the pid still names it: the pid file outlives
// the process, and the pid may have been reused since.
func signalChild(dir string, sig syscall.Signal) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	b, err := os.ReadFile(filepath.Join(dir, pidName))
	if err != nil {
		return err
	}
	pid, err := strconv.Atoi(string(b))
	if err != nil {
		return fmt.Errorf("%s: %w", pidName, err)
	}
	cmdline, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil || !bytes.Equal(cmdline, []byte(childArg0+"\x00"+dir+"\x00")) {
		return ErrNotRunning
	}
	err = syscall.Kill(pid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return ErrNotRunning
	}
	return err
}
