package localcluster

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func requireRoot(t *testing.T, tools ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
}

func TestUnescapeMount(t *testing.T) {
	cases := []struct{ in, want string }{
		{"/tmp/a", "/tmp/a"},
		{`/tmp/with\040space`, "/tmp/with space"},
		{`/tmp/tab\011x`, "/tmp/tab\tx"},
		{`/tmp/back\134slash`, `/tmp/back\slash`},
		{`/tmp/short\04`, `/tmp/short\04`},
	}
	for _, tc := range cases {
		if got := unescapeMount(tc.in); got != tc.want {
			t.Errorf("unescapeMount(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestPauseResumeKillAll drives sleep processes standing in for hosts.
func TestPauseResumeKillAll(t *testing.T) {
	requireRoot(t, "sleep")
	st := &State{}
	for i := range 2 {
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go cmd.Wait()
		t.Cleanup(func() { cmd.Process.Kill() })
		st.Hosts = append(st.Hosts, Host{Name: fmt.Sprintf("h%d", i), PID: cmd.Process.Pid})
	}
	if err := st.Pause("h0"); err != nil {
		t.Fatal(err)
	}
	if !st.Paused("h0") || st.Paused("h1") || !st.Running("h0") {
		t.Fatalf("after Pause(h0): paused %v %v, running %v", st.Paused("h0"), st.Paused("h1"), st.Running("h0"))
	}
	for range 2 { // Resume can be called twice
		if err := st.Resume("h0"); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(5 * time.Second); st.Paused("h0"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("h0 still paused after Resume")
		}
	}
	if err := st.Pause("h1"); err != nil { // a paused process dies of SIGKILL all the same
		t.Fatal(err)
	}
	if err := st.KillAll("h0", "h1"); err != nil {
		t.Fatal(err)
	}
	if st.Running("h0") || st.Running("h1") {
		t.Fatal("running after KillAll")
	}
	if err := st.Resume("h1"); err != nil {
		t.Fatalf("Resume of a dead host: %v", err)
	}
	if err := st.Pause("h1"); err == nil {
		t.Fatal("Pause of a dead host succeeded")
	}
}

// netnsHost makes a network namespace with an eth0 (one end of a veth pair inside it) for the primitives.
func netnsHost(t *testing.T) (*State, *Host) {
	t.Helper()
	requireRoot(t, "ip", "iptables", "nsenter")
	h := Host{Name: "h", Netns: fmt.Sprintf("skl-faults-test-%d", os.Getpid())}
	if err := run("ip", "netns", "add", h.Netns); err != nil {
		t.Skipf("cannot make a network namespace: %v", err)
	}
	t.Cleanup(func() { _ = run("ip", "netns", "del", h.Netns) })
	if err := h.InNetns("ip", "link", "add", "eth0", "type", "veth", "peer", "name", "eth1"); err != nil {
		t.Fatal(err)
	}
	st := &State{Hosts: []Host{h}}
	return st, &st.Hosts[0]
}

func rules(t *testing.T, h *Host, chain string) string {
	t.Helper()
	argv := h.inNetns("iptables", "-w", "-S", chain)
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	return string(out)
}

func TestRulesUndoTwice(t *testing.T) {
	st, h := netnsHost(t)
	from := []string{"10.99.0.1", "10.99.0.2"}

	// DropInbound twice adds each rule once; UndropInbound twice removes them and then does nothing.
	for range 2 {
		if err := st.DropInbound("h", from); err != nil {
			t.Fatal(err)
		}
	}
	if got := strings.Count(rules(t, h, "INPUT"), oneWayComment); got != 2 {
		t.Fatalf("%d one-way rules, want 2:\n%s", got, rules(t, h, "INPUT"))
	}
	if out := rules(t, h, "OUTPUT"); strings.Contains(out, "DROP") {
		t.Fatalf("DropInbound touched OUTPUT:\n%s", out)
	}
	for range 2 {
		if err := st.UndropInbound("h", from); err != nil {
			t.Fatal(err)
		}
	}
	if out := rules(t, h, "INPUT"); strings.Contains(out, "DROP") {
		t.Fatalf("left after UndropInbound:\n%s", out)
	}

	// Unpartition undoes a Partition, and one that failed halfway (only the first INPUT rule made).
	if err := st.Partition("h", from); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := st.Unpartition("h", from); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.InNetns("iptables", "-w", "-I", "INPUT", "-s", from[0], "-j", "DROP"); err != nil {
		t.Fatal(err)
	}
	if err := st.Unpartition("h", from); err != nil {
		t.Fatal(err)
	}
	if out := rules(t, h, "INPUT") + rules(t, h, "OUTPUT"); strings.Contains(out, "DROP") {
		t.Fatalf("left after Unpartition:\n%s", out)
	}

	// Loss, and ClearLoss by its mark.
	if err := st.Loss("h", 0.2); err != nil {
		t.Fatal(err)
	}
	if out := rules(t, h, "INPUT"); !strings.Contains(out, "statistic") {
		t.Fatalf("no loss rule:\n%s", out)
	}
	for range 2 {
		if err := st.ClearLoss("h"); err != nil {
			t.Fatal(err)
		}
	}
	if out := rules(t, h, "INPUT"); strings.Contains(out, "DROP") {
		t.Fatalf("left after ClearLoss:\n%s", out)
	}
}

func TestNetem(t *testing.T) {
	st, h := netnsHost(t)
	requireRoot(t, "tc")
	if err := h.InNetns("ip", "link", "set", "eth0", "up"); err != nil {
		t.Fatal(err)
	}
	if err := st.ClearNetem("h"); err != nil { // none to clear
		t.Fatal(err)
	}
	err := st.Netem("h", "delay", "75ms", "50ms", "loss", "20%")
	if errors.Is(err, ErrNoNetem) {
		t.Skipf("no netem here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := st.ClearNetem("h"); err != nil {
			t.Fatal(err)
		}
	}
}

// TestDataDirOnLoop moves a data dir onto a loop filesystem, fills it, frees it, writes there, and moves it
// back with what was written; then, a second time, leaves it for ReleaseDataDirs and CleanupFaults.
func TestDataDirOnLoop(t *testing.T) {
	requireRoot(t, "mkfs.ext4", "losetup", "mount", "umount", "cp")
	dir := t.TempDir()
	st := &State{Hosts: []Host{{Name: "server-1", Role: "server"}}} // PID 0: not running
	data := DataDir(dir, "server-1")
	if err := os.MkdirAll(filepath.Join(data, "raft"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, "raft", "raft.db"), []byte("log"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ReleaseDataDirs(dir); err != nil {
			t.Error(err)
		}
	})
	leftovers := func() string {
		mounts, _ := os.ReadFile("/proc/self/mountinfo")
		loops, _ := exec.Command("losetup", "--list").Output()
		return grep(string(mounts), dir) + grep(string(loops), dir)
	}

	if err := st.MoveDataDirToLoop(dir, "server-1", 1<<20); err != nil {
		t.Fatal(err)
	}
	if mounted, err := DataDirMounted(dir, "server-1"); err != nil || !mounted {
		t.Fatalf("not mounted after the move: %v", err)
	}
	if err := st.MoveDataDirToLoop(dir, "server-1", 1<<20); err != nil { // a second move does nothing
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(data, "raft", "raft.db")); err != nil || string(got) != "log" {
		t.Fatalf("raft.db on the loop filesystem: %q %v", got, err)
	}
	if _, err := os.Stat(data + ".pre-loop"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the original is still there: %v", err)
	}

	if _, grown, err := FillDisk(data); err != nil || grown < 32<<20 {
		t.Fatalf("FillDisk: grew %d, %v", grown, err)
	}
	if err := os.WriteFile(filepath.Join(data, "more"), make([]byte, 64<<10), 0o600); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("writing on the full filesystem: %v, want ENOSPC", err)
	}
	for range 2 {
		if err := RemoveFiller(data); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(data, "more"), []byte("written on the loop"), 0o600); err != nil {
		t.Fatal(err)
	}

	if err := st.RestoreDataDir(dir, "server-1"); err != nil {
		t.Fatal(err)
	}
	if mounted, _ := DataDirMounted(dir, "server-1"); mounted {
		t.Fatal("still mounted after the restore")
	}
	if got, err := os.ReadFile(filepath.Join(data, "more")); err != nil || string(got) != "written on the loop" {
		t.Fatalf("after the restore: %q %v", got, err)
	}
	if err := st.RestoreDataDir(dir, "server-1"); err != nil { // nothing to restore
		t.Fatal(err)
	}
	if left := leftovers(); left != "" {
		t.Fatalf("left after the restore:\n%s", left)
	}

	// Moved again and released without a restore (a cluster going down): nothing left either, and the
	// cleanup of a directory without state.json still works.
	if err := st.MoveDataDirToLoop(dir, "server-1", 0); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := CleanupFaults(dir); err != nil {
			t.Fatal(err)
		}
	}
	if left := leftovers(); left != "" {
		t.Fatalf("left after CleanupFaults:\n%s", left)
	}
}

func grep(s, sub string) string {
	var out []string
	for _, line := range strings.Split(s, "\n") {
		if strings.Contains(line, sub) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
