// Command skiff-pause is the process of a pod's sandbox container, like Kubernetes' pause: it holds the pod's
// namespaces open and does nothing else. It blocks until SIGINT or SIGTERM and then exits 0.
//
// It may be PID 1 of the pod's PID namespace, where orphaned processes are re-parented to it, so it reaps every
// child that exits instead of leaving zombies. It is built static (internal/images.StaticBinary) and is the
// only file of the pause image (internal/images.PauseImage).
package main

import (
	"errors"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// Go's handler also makes PID 1 (which ignores signals that have no handler) stop on SIGTERM.
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range sigs {
		if sig == syscall.SIGCHLD {
			reap()
			continue
		}
		os.Exit(0)
	}
}

// reap collects every child that has exited. Signals coalesce, so one SIGCHLD may stand for many children: it
// loops until none is left to collect.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if pid <= 0 || err != nil {
			return // no child has exited (0), or there are no children (ECHILD)
		}
	}
}
