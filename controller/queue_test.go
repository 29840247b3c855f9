package controller

import (
	"context"
	"errors"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// TestKeyQueueRetries: a conflict goes to the short "behind" backoff, another error to the failure
// backoff, a success resets both and asks for the recheck it returned, and an error after the context
// ended (leadership lost) is not retried.
func TestKeyQueueRetries(t *testing.T) {
	conflict := apierrors.NewConflict(schema.GroupResource{Resource: "pods"}, "a", errors.New("changed"))
	steps := []struct {
		recheck time.Duration
		err     error
	}{{0, conflict}, {0, errors.New("boom")}, {time.Millisecond, nil}, {0, errors.New("after the end")}}
	var step int
	q := newKeyQueue(queueConfig{what: "test", sync: func(context.Context, string) (time.Duration, error) {
		return steps[step].recheck, steps[step].err
	}})
	defer q.shutDown()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	q.add("ns/a")
	for step = range steps {
		if step == len(steps)-1 {
			cancel()
		}
		if !q.processNext(ctx) {
			t.Fatal("queue shut down")
		}
		behind, failures := q.retryBehind.NumRequeues("ns/a"), q.queue.NumRequeues("ns/a")
		switch step {
		case 0:
			if behind != 1 || failures != 0 {
				t.Fatalf("conflict: behind %d, failures %d", behind, failures)
			}
		case 1:
			if behind != 1 || failures != 1 {
				t.Fatalf("error: behind %d, failures %d", behind, failures)
			}
		case 2:
			if behind != 0 || failures != 0 {
				t.Fatalf("success: behind %d, failures %d; want both reset", behind, failures)
			}
		case 3:
			time.Sleep(50 * time.Millisecond)
			if q.queue.Len() != 0 {
				t.Fatal("an error after the context ended was retried")
			}
			continue
		}
		eventually(t, "the key back in the queue", func() bool { return q.queue.Len() == 1 })
	}
}
