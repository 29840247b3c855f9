package nodeagent

import (
	"sync"
	"testing"
	"time"
)

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) add(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	return c.t
}

func TestBackoffCrashLoop(t *testing.T) {
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	b := newRestartBackoff(crashLoopInitialBackoff, crashLoopMaxBackoff, crashLoopBackoffReset, clock.now)
	key := backoffKey("uid-1", "app")
	if in, left := b.inBackoff(key); in || left != 0 {
		t.Fatalf("inBackoff before any exit = %v, %s", in, left)
	}
	want := []time.Duration{10, 20, 40, 80, 160, 300, 300, 300}
	for i, w := range want {
		w *= time.Second
		started := clock.add(time.Second)
		finished := clock.add(5 * time.Second) // ran 5 s, then crashed
		until := b.next(key, started, finished)
		if got := until.Sub(finished); got != w {
			t.Fatalf("restart %d: delay %s, want %s", i+1, got, w)
		}
		if again := b.next(key, started, finished); !again.Equal(until) {
			t.Fatalf("restart %d: recording the same exit again moved the time to %s", i+1, again.Sub(finished))
		}
		if got := b.delay(key); got != w {
			t.Fatalf("delay() = %s, want %s", got, w)
		}
		if in, left := b.inBackoff(key); !in || left != w {
			t.Fatalf("right after the exit: inBackoff = %v, %s; want true, %s", in, left, w)
		}
		clock.add(w - time.Second)
		if in, left := b.inBackoff(key); !in || left != time.Second {
			t.Fatalf("a second early: inBackoff = %v, %s", in, left)
		}
		clock.add(time.Second)
		if in, _ := b.inBackoff(key); in {
			t.Fatalf("restart %d: still in backoff after %s", i+1, w)
		}
	}

	// A container that ran 10 minutes before it exited starts over at 10 s.
	started := clock.add(time.Second)
	finished := clock.add(10 * time.Minute)
	if got := b.next(key, started, finished).Sub(finished); got != 10*time.Second {
		t.Fatalf("after 10 min running: delay %s, want 10s", got)
	}
	started, finished = clock.add(time.Second), clock.add(time.Second)
	if got := b.next(key, started, finished).Sub(finished); got != 20*time.Second {
		t.Fatalf("crash after the reset: delay %s, want 20s", got)
	}
	// Just under 10 minutes does not reset.
	started, finished = clock.add(time.Second), clock.add(10*time.Minute-time.Second)
	if got := b.next(key, started, finished).Sub(finished); got != 40*time.Second {
		t.Fatalf("after 9m59s running: delay %s, want 40s", got)
	}

	// Keys are independent; forget starts a key over.
	other := backoffKey("uid-1", "sidecar")
	if in, _ := b.inBackoff(other); in {
		t.Fatal("another container is in backoff")
	}
	b.forget(key)
	if in, _ := b.inBackoff(key); in {
		t.Fatal("in backoff after forget")
	}
	started, finished = clock.add(time.Second), clock.add(time.Second)
	if got := b.next(key, started, finished).Sub(finished); got != 10*time.Second {
		t.Fatalf("after forget: delay %s, want 10s", got)
	}
	b.next(other, started, finished)
	b.next(backoffKey("uid-2", "app"), started, finished)
	b.forgetPod("uid-1")
	if b.delay(key) != 0 || b.delay(other) != 0 || b.delay(backoffKey("uid-2", "app")) != 10*time.Second {
		t.Fatal("forgetPod must forget exactly the pod's keys")
	}
}

func TestBackoffImagePull(t *testing.T) {
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	b := newRestartBackoff(imagePullInitialBackoff, imagePullMaxBackoff, 0, clock.now)
	key := "registry.example/app:1"
	for i, w := range []time.Duration{10, 20, 40, 80, 160, 300, 300} {
		w *= time.Second
		now := clock.add(time.Hour) // no reset however long between failures
		if got := b.next(key, time.Time{}, time.Time{}).Sub(now); got != w {
			t.Fatalf("pull failure %d: delay %s, want %s", i+1, got, w)
		}
	}
	if in, left := b.inBackoff(key); !in || left != 300*time.Second {
		t.Fatalf("inBackoff = %v, %s", in, left)
	}
}

func TestBackoffConcurrent(t *testing.T) {
	b := newRestartBackoff(time.Second, time.Minute, time.Minute, nil)
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 200; j++ {
				now := time.Now()
				b.next("k", now.Add(-time.Second), now)
				b.inBackoff("k")
				if j%50 == 0 {
					b.forget("k")
				}
			}
		}()
	}
	wg.Wait()
	if d := b.delay("k"); d < time.Second || d > time.Minute {
		t.Fatalf("delay %s out of bounds", d)
	}
}
