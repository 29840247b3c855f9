package localcluster

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// TestDownAfterPartialDown: down finishes the job of a down cut short after it had removed the hosts'
// network namespaces and links (their processes gone, state.json left): it removes the directory instead of
// failing to enter a namespace that is no longer there.
func TestDownAfterPartialDown(t *testing.T) {
	dir := t.TempDir()
	config := filepath.Join(dir, "agent-1", "agent.hcl")
	if err := os.MkdirAll(filepath.Dir(config), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(config, []byte("agent {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	st := State{ID: "gone", Bridge: "skltestgone0", Binary: "/bin/false", Hosts: []Host{
		{Name: "agent-1", Role: "agent", Netns: "skl-test-gone-agent-1", Veth: "skltgone1", Config: config, PID: 0},
	}}
	b, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(stateFile(dir), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Down(dir); err != nil {
		t.Fatalf("down after a partial down: %v", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the cluster directory is still there: %v", err)
	}
}
