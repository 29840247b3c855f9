package logtail

import (
	"fmt"
	"strings"
	"testing"
)

func TestTailKeepsTheLastWholeLines(t *testing.T) {
	tail := New(64)
	for i := 0; i < 100; i++ {
		fmt.Fprintf(tail, "line %03d\n", i)
	}
	got := string(tail.Bytes())
	if len(got) > 64 || !strings.HasPrefix(got, "line ") || !strings.HasSuffix(got, "line 099\n") {
		t.Fatalf("tail %q", got)
	}
	lines := strings.Split(strings.TrimSuffix(got, "\n"), "\n")
	for i, l := range lines {
		if want := fmt.Sprintf("line %03d", 100-len(lines)+i); l != want {
			t.Fatalf("line %d is %q, want %q", i, l, want)
		}
	}
	// A single write longer than the size keeps its last part from a line start, or its tail.
	tail = New(10)
	tail.Write([]byte(strings.Repeat("x", 30)))
	if got := tail.Bytes(); len(got) > 10 {
		t.Fatalf("kept %d bytes of a 10-byte tail", len(got))
	}
}
