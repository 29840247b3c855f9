package containerio

import (
	"bytes"
	"errors"
	"io"
	"os"
	"sync/atomic"
	"time"
)

const (
	// maxLine is the longest content of one log line, the kubelet's and containerd's default
	// (max_container_log_line_size): longer output is split into partial lines.
	maxLine = 16 << 10
	// partialDelay is how long an unfinished line waits for the rest of it before it is written as a partial
	// line. Long enough that a line written in two calls (text, then "\n") stays one line; short enough that a
	// prompt shows at once.
	partialDelay = 10 * time.Millisecond
)

// stream is one output of the container: the read side of its FIFO.
type stream struct {
	name     logStream
	r        *os.File // must support read deadlines, as a FIFO or pipe opened through package os does
	stopping atomic.Bool
}

// stop makes copyTo write what it holds and return although the writer may still be there.
func (s *stream) stop() {
	s.stopping.Store(true)
	// Wake a Read in progress. copyTo sets its own deadline before it checks stopping, so this one cannot be
	// overwritten unseen.
	_ = s.r.SetReadDeadline(time.Unix(1, 0))
}

// copyTo writes what the stream delivers into out as CRI log lines, until the writer is gone or stop is
// called.
func (s *stream) copyTo(out *logFile) error {
	chunk := make([]byte, 32<<10)
	var pending []byte // the start of a line whose end has not come yet
	for {
		// Wait without limit for the next line; a started one gets only partialDelay.
		var deadline time.Time
		if len(pending) > 0 {
			deadline = time.Now().Add(partialDelay)
		}
		if err := s.r.SetReadDeadline(deadline); err != nil {
			return err
		}
		var err error
		if s.stopping.Load() {
			err = io.EOF
		} else {
			var n int
			n, err = s.r.Read(chunk)
			pending = writeLines(append(pending, chunk[:n]...), s.name, out)
		}
		if err != nil && len(pending) > 0 {
			// A prompt waiting for input, or all there will be.
			out.write(s.name, tagPartial, pending)
			pending = pending[:0]
		}
		switch {
		case err == nil, errors.Is(err, os.ErrDeadlineExceeded):
		case errors.Is(err, io.EOF):
			return nil
		default:
			return err
		}
	}
}

// writeLines writes the complete lines at the start of b as full lines, and cuts content longer than maxLine
// into partial lines. It returns the rest, an unfinished line, moved to the start of b.
func writeLines(b []byte, stream logStream, out *logFile) []byte {
	rest := b
	for {
		if i := bytes.IndexByte(rest, '\n'); i >= 0 && i <= maxLine {
			out.write(stream, tagFull, rest[:i])
			rest = rest[i+1:]
		} else if len(rest) >= maxLine {
			out.write(stream, tagPartial, rest[:maxLine])
			rest = rest[maxLine:]
		} else {
			break
		}
	}
	return b[:copy(b, rest)]
}
