package nodeagent

import (
	"errors"
	"fmt"
	"testing"

	"github.com/containerd/containerd/errdefs"
)

// TestTaskLeftOver: a task create is retried after clearing what a killed agent left, whether containerd says
// AlreadyExists (a task it knows) or its shim fails to make the bundle directory (a create it never finished,
// which containerd 1.6 reports with no code); other errors are not.
func TestTaskLeftOver(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{fmt.Errorf("creating task: %w", errdefs.ErrAlreadyExists), true},
		{errors.New("failed to start shim: mkdir /data/containerd/state/io.containerd.runtime.v2.task/skiff/abc-app-once-0: file exists: unknown"), true},
		{errors.New("failed to create shim task: OCI runtime create failed: exec: \"nope\": executable file not found in $PATH"), false},
	} {
		if got := taskLeftOver(tc.err); got != tc.want {
			t.Errorf("taskLeftOver(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
