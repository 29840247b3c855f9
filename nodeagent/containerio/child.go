package containerio

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
)

// openTimeout bounds the wait for the shim to open the output FIFOs: the agent may have died, or NewTask
// failed, after Start.
const openTimeout = 2 * time.Minute

// readyFD is the descriptor of the pipe on which the child tells Start it is ready (exec.Cmd.ExtraFiles[0]).
const readyFD = 3

// RunChildIfAsked turns this process into a container's stdio process when Start spawned it, and exits when
// that is done. Otherwise it returns at once. main calls it before anything else.
func RunChildIfAsked() {
	dir, ok := os.LookupEnv(envDir)
	if !ok {
		return
	}
	logger := hclog.New(&hclog.LoggerOptions{Name: "container-io", Output: os.Stderr})
	if err := runChild(dir, logger); err != nil {
		logger.Error("container io stopped", "dir", dir, "error", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// runChild is the stdio process:
//  1. read spec.json, open the log file and hold the stdin FIFO open for writing, so the container's stdin
//     sees no EOF between attaches;
//  2. tell Start it is ready;
//  3. open the output FIFOs, which waits for the shim to open their write sides;
//  4. copy the outputs into the log until both end (the container is gone) or SIGTERM.
//
// SIGUSR1 closes the stdin writer at any time (stdinOnce), so the container's stdin ends with the last
// attacher's.
func runChild(dir string, logger hclog.Logger) error {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGUSR1)

	spec, err := readSpec(dir)
	if err != nil {
		return err
	}
	out, err := openLogFile(spec, logger)
	if err != nil {
		return err
	}
	defer out.Close()
	var stdin *os.File
	if spec.Stdin {
		// O_RDWR opens without waiting for a reader.
		if stdin, err = os.OpenFile(filepath.Join(dir, stdinName), os.O_RDWR, 0); err != nil {
			return err
		}
	}
	closeStdin := sync.OnceFunc(func() {
		if stdin != nil {
			stdin.Close()
		}
	})
	defer closeStdin()
	if err := signalReady(); err != nil {
		return err
	}

	streams, err := openStreams(dir, spec.Tty, signals, closeStdin)
	if err != nil || streams == nil {
		return err
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, s := range streams {
		wg.Go(func() {
			if err := s.copyTo(out); err != nil {
				logger.Error("copy output", "stream", s.name, "error", err)
			}
		})
	}
	go func() { wg.Wait(); close(done) }()
	for {
		select {
		case <-done:
			return nil
		case sig := <-signals:
			if sig == syscall.SIGUSR1 {
				closeStdin()
				continue
			}
			for _, s := range streams {
				s.stop()
			}
		}
	}
}

func readSpec(dir string) (Spec, error) {
	var spec Spec
	b, err := os.ReadFile(filepath.Join(dir, specName))
	if err != nil {
		return spec, err
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		return spec, fmt.Errorf("%s: %w", specName, err)
	}
	return spec, nil
}

func signalReady() error {
	ready := os.NewFile(readyFD, "ready")
	defer ready.Close()
	_, err := ready.Write([]byte{1})
	return err
}

// openStreams opens the output FIFOs for reading. Each open waits for the shim's writer, so both wait at once:
// the order in which the shim opens them is its business. It returns no streams, and no error, when SIGTERM
// came first.
func openStreams(dir string, tty bool, signals <-chan os.Signal, closeStdin func()) ([]*stream, error) {
	names := []logStream{streamStdout}
	if !tty {
		names = append(names, streamStderr)
	}
	type opened struct {
		s   *stream
		err error
	}
	results := make(chan opened, len(names))
	for _, name := range names {
		go func() {
			r, err := os.OpenFile(filepath.Join(dir, string(name)), os.O_RDONLY, 0)
			results <- opened{&stream{name: name, r: r}, err}
		}()
	}
	timeout := time.After(openTimeout)
	var streams []*stream
	for len(streams) < len(names) {
		select {
		case o := <-results:
			if o.err != nil {
				return nil, o.err
			}
			streams = append(streams, o.s)
		case <-timeout:
			return nil, fmt.Errorf("no writer opened the output FIFOs within %v", openTimeout)
		case sig := <-signals:
			if sig != syscall.SIGUSR1 {
				return nil, nil
			}
			closeStdin()
		}
	}
	return streams, nil
}
