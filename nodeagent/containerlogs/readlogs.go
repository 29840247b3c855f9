// Package containerlogs serves a container's CRI log file as the kubelet serves `kubectl logs`: tail, since,
// timestamps and follow across rotations, with cri-client's reader. It is apart from containerio, which writes
// those files, so that the stdio process (a small binary of its own) links none of the CRI client.
package containerlogs

import (
	"context"
	"io"

	internalapi "k8s.io/cri-api/pkg/apis"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/logs"
)

// ReadLogs writes the container's log at path to stdout and stderr, as the kubelet serves `kubectl logs`.
// With opts.Follow it keeps reading, across rotations, while running reports the container running, and until
// ctx ends; running is not called otherwise.
func ReadLogs(ctx context.Context, path string, opts *logs.LogOptions, running func() bool, stdout, stderr io.Writer) error {
	return logs.ReadLogs(ctx, path, "", opts, runningStatus{running: running}, stdout, stderr)
}

// runningStatus answers the one question logs.ReadLogs asks the runtime while following: is the container
// still running? Any other method would panic on the nil interface; ReadLogs calls none.
type runningStatus struct {
	internalapi.RuntimeService
	running func() bool
}

func (r runningStatus) ContainerStatus(context.Context, string, bool) (*runtimeapi.ContainerStatusResponse, error) {
	state := runtimeapi.ContainerState_CONTAINER_EXITED
	if r.running() {
		state = runtimeapi.ContainerState_CONTAINER_RUNNING
	}
	return &runtimeapi.ContainerStatusResponse{Status: &runtimeapi.ContainerStatus{State: state}}, nil
}
