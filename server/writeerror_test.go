package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/skiff-dev/skiff/fsm"
	"github.com/skiff-dev/skiff/raftnode"
)

// The operator endpoints answer the Raft layer's errors as the API does: a write that certainly did
// nothing is 503 with Retry-After, one whose outcome is unknown 504 without it (clients must not resend it).
func TestWriteError(t *testing.T) {
	for _, c := range []struct {
		err        error
		code       int
		retryAfter bool
	}{
		{fmt.Errorf("apply: %w", raftnode.ErrUnknownOutcome), http.StatusGatewayTimeout, false},
		{raftnode.ErrNotLeader, http.StatusServiceUnavailable, true},
		{raftnode.ErrNoLeader, http.StatusServiceUnavailable, true},
		{raftnode.ErrShutdown, http.StatusServiceUnavailable, true},
		{context.DeadlineExceeded, http.StatusGatewayTimeout, false},
		{fmt.Errorf("restore: %w", fsm.ErrNewerSnapshot), http.StatusBadRequest, false},
		{errors.New("disk on fire"), http.StatusInternalServerError, false},
	} {
		rec := httptest.NewRecorder()
		writeError(rec, c.err)
		if rec.Code != c.code || (rec.Header().Get("Retry-After") != "") != c.retryAfter {
			t.Errorf("%v: %d, Retry-After %q; want %d, Retry-After %v", c.err, rec.Code, rec.Header().Get("Retry-After"), c.code, c.retryAfter)
		}
	}
}
