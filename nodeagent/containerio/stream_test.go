package containerio

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// pipeStream is a stream fed through a pipe, as a FIFO from the shim would be, copying into out.
func pipeStream(t *testing.T, name logStream, out *logFile) (w *os.File, done <-chan error) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	errc := make(chan error, 1)
	go func() { errc <- (&stream{name: name, r: r}).copyTo(out) }()
	return w, errc
}

func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestCopyStreamLines(t *testing.T) {
	long := strings.Repeat("x", maxLine)
	cases := []struct {
		name   string
		stream logStream
		writes []string
		want   []logLine
	}{
		{"full lines", streamStdout, []string{"a\nb\n\n"},
			[]logLine{{"stdout", "F", "a"}, {"stdout", "F", "b"}, {"stdout", "F", ""}}},
		{"stderr", streamStderr, []string{"oops\n"}, []logLine{{"stderr", "F", "oops"}}},
		{"end without newline", streamStdout, []string{"a\ntail"},
			[]logLine{{"stdout", "F", "a"}, {"stdout", "P", "tail"}}},
		{"long line is cut", streamStdout, []string{long + "yz\n"},
			[]logLine{{"stdout", "P", long}, {"stdout", "F", "yz"}}},
		{"line of exactly the maximum", streamStdout, []string{long + "\n"}, []logLine{{"stdout", "F", long}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out := testLogFile(t, Spec{})
			w, done := pipeStream(t, tc.stream, out)
			for _, s := range tc.writes {
				if _, err := w.WriteString(s); err != nil {
					t.Fatal(err)
				}
			}
			w.Close()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if got := readLogLines(t, out.path); !slices.Equal(got, tc.want) {
				t.Fatalf("got %.200v\nwant %.200v", got, tc.want)
			}
		})
	}
}

// A prompt never gets its newline until someone answers it: it must be in the file at once, as a partial line.
func TestCopyStreamPromptIsPrompt(t *testing.T) {
	out := testLogFile(t, Spec{})
	w, done := pipeStream(t, streamStdout, out)
	start := time.Now()
	if _, err := w.WriteString("login: "); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Second, "the prompt", func() bool {
		b, _ := os.ReadFile(out.path)
		return strings.HasSuffix(string(b), " stdout P login: \n")
	})
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("the prompt took %v to reach the file", took)
	}
	if _, err := w.WriteString("root\n"); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	want := []logLine{{"stdout", "P", "login: "}, {"stdout", "F", "root"}}
	if got := readLogLines(t, out.path); !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// Both streams write into one file at once: every line stays whole, and each stream keeps its order.
func TestCopyStreamsDoNotInterleave(t *testing.T) {
	out := testLogFile(t, Spec{})
	const n = 500
	var wg sync.WaitGroup
	var dones []<-chan error
	for _, name := range []logStream{streamStdout, streamStderr} {
		w, done := pipeStream(t, name, out)
		dones = append(dones, done)
		wg.Go(func() {
			defer w.Close()
			for i := range n {
				// Split each line over two writes, so a line is often cut where it could interleave.
				fmt.Fprintf(w, "%s-%03d-%s", name, i, strings.Repeat("m", 100))
				fmt.Fprintf(w, "%s\n", strings.Repeat("n", 100))
			}
		})
	}
	wg.Wait()
	for _, done := range dones {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	// Partial lines (a line cut by timing) are joined back, as a reader does.
	next := map[string]int{}
	joined := map[string]string{}
	for _, l := range readLogLines(t, out.path) {
		joined[l.stream] += l.content
		if l.tag == "P" {
			continue
		}
		want := fmt.Sprintf("%s-%03d-%s%s", l.stream, next[l.stream], strings.Repeat("m", 100), strings.Repeat("n", 100))
		if joined[l.stream] != want {
			t.Fatalf("%s line %d is %q, want %q", l.stream, next[l.stream], joined[l.stream], want)
		}
		joined[l.stream] = ""
		next[l.stream]++
	}
	if next["stdout"] != n || next["stderr"] != n {
		t.Fatalf("got %v lines, want %d of each", next, n)
	}
}
