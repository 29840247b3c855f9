package dns

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	mdns "github.com/miekg/dns"

	"github.com/skiff-dev/skiff/internal/freeport"
)

// TestNodeDNSProcessOutlivesItsStarter runs the node's DNS process from this test binary (TestMain calls
// RunChildIfAsked): it is adopted by a second EnsureChild with the same Corefile (an agent that restarted),
// replaced when the Corefile changes, reported when it cannot start, and gone after StopChild.
func TestNodeDNSProcessOutlivesItsStarter(t *testing.T) {
	dir := t.TempDir()
	t.Cleanup(func() { _ = StopChild(dir) })
	port := freeport.One(t, "127.0.0.1")
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	corefile := func(extra string) string {
		return fmt.Sprintf(".:%d {\n    bind 127.0.0.1\n    errors\n%s}\n", port, extra)
	}
	answers := func() bool {
		m := new(mdns.Msg)
		m.SetQuestion("example.org.", mdns.TypeA)
		_, _, err := (&mdns.Client{Timeout: 500 * time.Millisecond}).Exchange(m, addr)
		return err == nil
	}
	logger := hclog.NewNullLogger()
	spec := Spec{Corefile: corefile(""), Servers: []string{"127.0.0.1:1"}}
	started, err := EnsureChild(dir, os.Args[0], spec, logger)
	if err != nil || !started {
		t.Fatalf("first start: started=%v %v", started, err)
	}
	first := childPID(dir)
	if first == 0 || !answers() {
		t.Fatalf("pid %d, answering %v", first, answers())
	}
	// An agent that restarted finds it running and keeps it; new servers only rewrite the spec.
	spec.Servers = []string{"127.0.0.1:2"}
	if started, err := EnsureChild(dir, os.Args[0], spec, logger); err != nil || started || childPID(dir) != first {
		t.Fatalf("same Corefile: started=%v pid %d (was %d) %v", started, childPID(dir), first, err)
	}
	// A changed Corefile replaces it.
	spec.Corefile = corefile("    # changed\n")
	if started, err := EnsureChild(dir, os.Args[0], spec, logger); err != nil || !started {
		t.Fatalf("changed Corefile: started=%v %v", started, err)
	}
	second := childPID(dir)
	if second == 0 || second == first || syscall.Kill(first, 0) == nil && childPIDIs(first) || !answers() {
		t.Fatalf("after the change: pid %d (was %d), answering %v", second, first, answers())
	}
	// One that cannot start says why.
	spec.Corefile = fmt.Sprintf(".:%d {\n    bind 127.0.0.1\n    forward\n}\n", port)
	if _, err := EnsureChild(dir, os.Args[0], spec, logger); err == nil || !strings.Contains(err.Error(), "forward") {
		t.Fatalf("a bad Corefile: %v", err)
	}
	if err := StopChild(dir); err != nil || childPID(dir) != 0 {
		t.Fatalf("stop: %v, pid %d", err, childPID(dir))
	}
}

// childPIDIs tells whether pid is still a live, non-zombie process.
func childPIDIs(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	return err == nil && !zombie(stat)
}
