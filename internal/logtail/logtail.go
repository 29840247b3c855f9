// Package logtail keeps the last lines a process logged in memory, for the debug bundle an operator
// downloads (`skiff operator debug`) when the logs themselves went to a terminal or a journal they cannot
// reach.
package logtail

import (
	"bytes"
	"sync"
)

// Tail is an io.Writer that keeps the most recent bytes written to it, up to its size, cut at a line start.
type Tail struct {
	mu   sync.Mutex
	size int
	buf  []byte
}

// New returns a tail that keeps up to size bytes.
func New(size int) *Tail { return &Tail{size: size} }

// Write keeps p, dropping the oldest whole lines beyond the size. It never fails.
func (t *Tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.size; over > 0 {
		cut := over
		if i := bytes.IndexByte(t.buf[over:], '\n'); i >= 0 {
			cut = over + i + 1
		}
		t.buf = append(t.buf[:0], t.buf[min(cut, len(t.buf)):]...)
	}
	return len(p), nil
}

// Bytes returns a copy of what is kept, oldest first.
func (t *Tail) Bytes() []byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	return bytes.Clone(t.buf)
}
