package server

import "testing"

// A klog fatal once a shutdown has begun ends the goroutine that logged it, not the process.
func TestKlogFatalWhileStoppingEndsOnlyItsGoroutine(t *testing.T) {
	stopping.Store(true) // as after any server's Shutdown in this package's tests
	ended := make(chan bool)
	go func() {
		returned := false
		defer func() { ended <- returned }()
		exitUnlessStopping(255)
		returned = true
	}()
	if <-ended {
		t.Fatal("exitUnlessStopping returned to its caller")
	}
}
