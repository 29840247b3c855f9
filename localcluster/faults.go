package localcluster

// Host-level faults for the chaos suite, beyond Kill, Signal, Partition and Heal: pausing a process, killing
// several at once, one-way partitions, netem delay and loss, and a full disk (a server's data dir moved onto a
// small loop-mounted filesystem). Every undo here may be called twice, or after the fault failed halfway.
// CleanupFaults undoes whatever is left; ReleaseDataDirs is the part of it that needs no running cluster.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Running reports whether a host's process is alive (a paused one is).
func (s *State) Running(name string) bool {
	h, ok := s.Host(name)
	return ok && alive(h.PID)
}

// StartIfStopped starts a host whose process is not running, and does nothing to a running one: unlike
// Start, it can be called twice.
func (s *State) StartIfStopped(dir, name string) (started bool, err error) {
	if s.Running(name) {
		return false, nil
	}
	return true, s.Start(dir, name)
}

// Pause stops a host's process with SIGSTOP: it keeps its sockets and state but answers nothing.
func (s *State) Pause(name string) error {
	h, ok := s.Host(name)
	if !ok {
		return fmt.Errorf("no host %s", name)
	}
	if !alive(h.PID) {
		return fmt.Errorf("%s is not running", name)
	}
	if err := syscall.Kill(h.PID, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("SIGSTOP %s: %w", name, err)
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if s.Paused(name) {
			return nil
		}
	}
	return fmt.Errorf("%s (pid %d) is not stopped 5s after SIGSTOP", name, h.PID)
}

// Paused reports whether a host's process is stopped by a signal.
func (s *State) Paused(name string) bool {
	h, ok := s.Host(name)
	return ok && procState(h.PID) == "T"
}

// Resume continues a paused host with SIGCONT. A host that is not running, or not paused, is left alone.
func (s *State) Resume(name string) error {
	h, ok := s.Host(name)
	if !ok {
		return fmt.Errorf("no host %s", name)
	}
	if !alive(h.PID) {
		return nil
	}
	if err := syscall.Kill(h.PID, syscall.SIGCONT); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("SIGCONT %s: %w", name, err)
	}
	return nil
}

// procState is the state letter of /proc/<pid>/stat (R, S, T, Z...), empty when there is no such process.
func procState(pid int) string {
	if pid <= 0 {
		return ""
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	if len(fields) == 0 {
		return ""
	}
	return fields[0]
}

// KillAll sends SIGKILL to every named host at once, then waits until they have all exited.
func (s *State) KillAll(names ...string) error {
	var pids []int
	for _, name := range names {
		h, ok := s.Host(name)
		if !ok {
			return fmt.Errorf("no host %s", name)
		}
		pids = append(pids, h.PID)
	}
	for _, pid := range pids {
		if alive(pid) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	var errs []error
	for i, pid := range pids {
		if err := signalAndWait(pid, syscall.SIGKILL, 5*time.Second); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", names[i], err))
		}
	}
	return errors.Join(errs...)
}

// Unpartition removes the rules Partition added, those that are still there: unlike Heal, it can be called
// twice, or after a Partition that failed halfway. A rule Partition added twice loses one copy.
func (s *State) Unpartition(name string, from []string) error {
	h, ok := s.Host(name)
	if !ok {
		return fmt.Errorf("no host %s", name)
	}
	var errs []error
	for _, ip := range from {
		errs = append(errs, h.deleteRule("INPUT", "-s", ip, "-j", "DROP"), h.deleteRule("OUTPUT", "-d", ip, "-j", "DROP"))
	}
	return errors.Join(errs...)
}

// oneWayComment marks the rules of DropInbound, so that they are told from Partition's.
const oneWayComment = "skiff-chaos-oneway"

// DropInbound drops, in a host's namespace, every packet arriving from the given addresses while its own
// packets still leave: a one-way partition. (TCP cannot connect either way, since the replies are dropped
// too; UDP gossip does get out.) UndropInbound removes the rules.
func (s *State) DropInbound(name string, from []string) error {
	h, ok := s.Host(name)
	if !ok {
		return fmt.Errorf("no host %s", name)
	}
	for _, ip := range from {
		if err := h.ensureRule("INPUT", "-s", ip, "-m", "comment", "--comment", oneWayComment, "-j", "DROP"); err != nil {
			return err
		}
	}
	return nil
}

// UndropInbound removes DropInbound's rules; it can be called twice.
func (s *State) UndropInbound(name string, from []string) error {
	h, ok := s.Host(name)
	if !ok {
		return fmt.Errorf("no host %s", name)
	}
	var errs []error
	for _, ip := range from {
		errs = append(errs, h.deleteRule("INPUT", "-s", ip, "-m", "comment", "--comment", oneWayComment, "-j", "DROP"))
	}
	return errors.Join(errs...)
}

// hasRule reports whether the chain has the rule (iptables -C).
func (h *Host) hasRule(chain string, rule ...string) bool {
	argv := h.inNetns(append([]string{"iptables", "-w", "-C", chain}, rule...)...)
	return exec.Command(argv[0], argv[1:]...).Run() == nil
}

// ensureRule inserts the rule at the top of the chain unless it is there already.
func (h *Host) ensureRule(chain string, rule ...string) error {
	if h.hasRule(chain, rule...) {
		return nil
	}
	return h.InNetns(append([]string{"iptables", "-w", "-I", chain}, rule...)...)
}

// deleteRule deletes one copy of the rule, if the chain has it.
func (h *Host) deleteRule(chain string, rule ...string) error {
	if !h.hasRule(chain, rule...) {
		return nil
	}
	return h.InNetns(append([]string{"iptables", "-w", "-D", chain}, rule...)...)
}

// clearTagged deletes every rule of the chain that carries the comment.
func (h *Host) clearTagged(chain, comment string) error {
	argv := h.inNetns("iptables", "-w", "-S", chain)
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("iptables -S %s in %s: %v: %s", chain, h.Name, err, strings.TrimSpace(string(out)))
	}
	var errs []error
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "-A" || !slices.Contains(f, comment) {
			continue
		}
		errs = append(errs, h.InNetns(append([]string{"iptables", "-w", "-D"}, f[1:]...)...))
	}
	return errors.Join(errs...)
}

// ErrNoNetem is what Netem returns when the kernel has no netem queueing discipline (sch_netem).
var ErrNoNetem = errors.New("the kernel has no netem queueing discipline (sch_netem)")

// Netem sets a netem queueing discipline on the egress of a host's eth0 (args as after `tc qdisc ... netem`,
// such as "delay", "75ms", "50ms", "loss", "20%"): every packet the host sends to the others goes through it.
// It replaces the one Netem set before; ClearNetem removes it.
func (s *State) Netem(name string, args ...string) error {
	h, ok := s.Host(name)
	if !ok {
		return fmt.Errorf("no host %s", name)
	}
	err := h.InNetns(append([]string{"tc", "qdisc", "replace", "dev", "eth0", "root", "netem"}, args...)...)
	if err != nil && strings.Contains(err.Error(), "qdisc kind is unknown") {
		return fmt.Errorf("%w: %v", ErrNoNetem, err)
	}
	return err
}

// lossComment marks the rules of Loss.
const lossComment = "skiff-chaos-loss"

// Loss drops each packet arriving at a host's eth0 with the given probability (iptables' statistic match):
// netem's loss without its delay, for a kernel without netem. It drops on the way in rather than out, so
// that the sender sees a lost packet, not an error from sendto. ClearLoss removes it.
func (s *State) Loss(name string, probability float64) error {
	h, ok := s.Host(name)
	if !ok {
		return fmt.Errorf("no host %s", name)
	}
	return h.ensureRule("INPUT", "-i", "eth0", "-m", "statistic", "--mode", "random", "--probability",
		strconv.FormatFloat(probability, 'f', -1, 64), "-m", "comment", "--comment", lossComment, "-j", "DROP")
}

// ClearLoss removes Loss's rules from a host; it can be called twice.
func (s *State) ClearLoss(name string) error {
	h, ok := s.Host(name)
	if !ok {
		return fmt.Errorf("no host %s", name)
	}
	return h.clearTagged("INPUT", lossComment)
}

// ClearNetem removes Netem's discipline from a host's eth0, if there is one.
func (s *State) ClearNetem(name string) error {
	h, ok := s.Host(name)
	if !ok {
		return fmt.Errorf("no host %s", name)
	}
	argv := h.inNetns("tc", "qdisc", "show", "dev", "eth0", "root")
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("tc qdisc show in %s: %v: %s", name, err, strings.TrimSpace(string(out)))
	}
	if !strings.Contains(string(out), "netem") {
		return nil
	}
	return h.InNetns("tc", "qdisc", "del", "dev", "eth0", "root")
}

// DataDir is a host's data directory (its HCL's data_dir).
func DataDir(dir, name string) string { return filepath.Join(dir, name, "data") }

// DataDirMounted reports whether a host's data dir is a mount point (MoveDataDirToLoop's filesystem).
func DataDirMounted(dir, name string) (bool, error) { return isMountPoint(DataDir(dir, name)) }

// faultImage is the filesystem image MoveDataDirToLoop makes for a host.
func faultImage(dir, name string) string { return filepath.Join(dir, "faults", name+".img") }

// loopMu serializes the data dir moves: two at once would race on the loop devices' allocation for nothing.
var loopMu sync.Mutex

// MoveDataDirToLoop puts a stopped host's data dir on a filesystem of its own, so that FillDisk can fill it:
// an ext4 image of the data's size plus headroom (64 MiB at least) in <dir>/faults, loop-mounted (with
// discard, so that freed blocks leave the image) at the data dir, holding a copy of the data. The host
// then runs on it until RestoreDataDir. A data dir that is a mount already is left as it is.
func (s *State) MoveDataDirToLoop(dir, name string, headroom int64) (err error) {
	loopMu.Lock()
	defer loopMu.Unlock()
	if _, ok := s.Host(name); !ok {
		return fmt.Errorf("no host %s", name)
	}
	if s.Running(name) {
		return fmt.Errorf("%s is running; stop it before moving its data dir", name)
	}
	data := DataDir(dir, name)
	if mounted, err := isMountPoint(data); err != nil || mounted {
		return err
	}
	old := data + ".pre-loop"
	if _, err := os.Stat(old); err == nil {
		return fmt.Errorf("%s is left from a move that failed; move it back to %s by hand", old, data)
	}
	usage, err := diskUsage(data)
	if err != nil {
		return err
	}
	const mib = 1 << 20
	size := max(64*mib, (usage+headroom+mib-1)/mib*mib)
	img := faultImage(dir, name)
	if err := os.MkdirAll(filepath.Dir(img), 0o700); err != nil {
		return err
	}
	if err := os.Remove(img); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	f, err := os.OpenFile(img, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(img)
		return err
	}
	// No reserved blocks (-m 0): the server runs as root and would use them, so "full" would depend on it.
	if err := run("mkfs.ext4", "-q", "-F", "-m", "0", "-E", "nodiscard", img); err != nil {
		os.Remove(img)
		return err
	}
	if err := os.Rename(data, old); err != nil {
		os.Remove(img)
		return err
	}
	// From here on a failure puts the original back.
	mounted := false
	defer func() {
		if err == nil {
			return
		}
		if mounted {
			if uerr := unmount(data); uerr != nil {
				err = errors.Join(err, uerr)
				return // the original stays in .pre-loop; ReleaseDataDirs and a hand move finish it
			}
		}
		os.Remove(data)
		if rerr := os.Rename(old, data); rerr != nil {
			err = errors.Join(err, rerr)
		}
		os.Remove(img)
	}()
	if err := os.Mkdir(data, 0o700); err != nil {
		return err
	}
	if err := run("mount", "-o", "loop,discard", img, data); err != nil {
		return err
	}
	mounted = true
	if err := os.Remove(filepath.Join(data, "lost+found")); err != nil {
		return err
	}
	if err := run("cp", "-a", old+"/.", data+"/"); err != nil {
		return err
	}
	return os.RemoveAll(old)
}

// RestoreDataDir moves a host's data dir back from MoveDataDirToLoop's filesystem, with everything the host
// wrote there: it stops the host (SIGTERM, SIGKILL after 10 s), copies the data beside the mount point,
// unmounts the filesystem (its loop device goes with it), puts the copy in place, removes the image and
// starts the host again if it was running. A data dir that is not a mount is left alone.
func (s *State) RestoreDataDir(dir, name string) error {
	loopMu.Lock()
	defer loopMu.Unlock()
	if _, ok := s.Host(name); !ok {
		return fmt.Errorf("no host %s", name)
	}
	data := DataDir(dir, name)
	if mounted, err := isMountPoint(data); err != nil || !mounted {
		return err
	}
	wasRunning := s.Running(name)
	if wasRunning {
		if err := s.Resume(name); err != nil { // a paused process would not see the SIGTERM
			return err
		}
		if err := s.Stop(name, 10*time.Second); err != nil {
			return err
		}
	}
	// A filler FillDisk left is not data.
	if err := RemoveFiller(data); err != nil {
		return err
	}
	restored := data + ".restore"
	if err := os.RemoveAll(restored); err != nil {
		return err
	}
	if err := run("cp", "-a", data, restored); err != nil {
		return err
	}
	if err := unmount(data); err != nil {
		return err
	}
	if err := os.Remove(data); err != nil {
		return err
	}
	if err := os.Rename(restored, data); err != nil {
		return err
	}
	if err := os.Remove(faultImage(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if wasRunning {
		return s.Start(dir, name)
	}
	return nil
}

// FillerName is the file FillDisk writes.
const FillerName = "skiff-chaos-filler"

// FillDisk fills the filesystem holding path with a file, path/FillerName, until no block is left, and
// returns the file and how much it grew by. ext4 allocates the space without writing it, so this is quick
// and the image under a loop mount stays sparse. Removing the file frees the space.
func FillDisk(path string) (filler string, grown int64, err error) {
	filler = filepath.Join(path, FillerName)
	f, err := os.OpenFile(filler, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return filler, 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return filler, 0, err
	}
	start, end := fi.Size(), fi.Size()
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return filler, 0, err
	}
	// Big chunks first, down to one block: the last blocks go to whoever asks first, and the metadata of the
	// extents takes some too.
	chunk := max(int64(st.Bavail)*st.Bsize, st.Bsize)
	for chunk >= st.Bsize {
		err := syscall.Fallocate(int(f.Fd()), 0, end, chunk)
		switch {
		case err == nil:
			end += chunk
		case errors.Is(err, syscall.ENOSPC):
			chunk /= 2
		default:
			return filler, end - start, fmt.Errorf("fallocate %s: %w", filler, err)
		}
	}
	return filler, end - start, nil
}

// RemoveFiller deletes FillDisk's file from path, if it is there.
func RemoveFiller(path string) error {
	if err := os.Remove(filepath.Join(path, FillerName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// diskUsage is the space the files under path take.
func diskUsage(path string) (int64, error) {
	var total int64
	err := filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			total += st.Blocks * 512
		} else {
			total += info.Size()
		}
		return nil
	})
	return total, err
}

// unmount unmounts path, lazily if it is busy (a process still has files open there): the mount is gone at
// once and the kernel frees the filesystem, and with it the loop device, when the last file is closed.
func unmount(path string) error {
	if err := run("umount", path); err != nil {
		if lerr := run("umount", "-l", path); lerr != nil {
			return errors.Join(err, lerr)
		}
	}
	return nil
}

// mountEntry is a line of /proc/self/mountinfo.
type mountEntry struct{ point, source string }

func mounts() ([]mountEntry, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []mountEntry
	for _, line := range strings.Split(string(data), "\n") {
		// id parent major:minor root point options [optional...] - fstype source superoptions
		f := strings.Fields(line)
		sep := slices.Index(f, "-")
		if len(f) < 5 || sep < 0 || sep+2 >= len(f) {
			continue
		}
		out = append(out, mountEntry{point: unescapeMount(f[4]), source: unescapeMount(f[sep+2])})
	}
	return out, nil
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space, and so on).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isMountPoint(path string) (bool, error) {
	ms, err := mounts()
	if err != nil {
		return false, err
	}
	for _, m := range ms {
		if m.point == path {
			return true, nil
		}
	}
	return false, nil
}

// ReleaseDataDirs unmounts every filesystem MoveDataDirToLoop mounted under dir (a loop device mounted at
// <dir>/<host>/data; containerd's own mounts under an agent's data dir are not touched) and detaches every
// loop device backed by an image in <dir>/faults. The data on them is not copied back (RestoreDataDir does
// that): this is for taking the cluster down, once its processes are stopped, and for cleaning up after
// a runner that died. It needs no state.json and can be called any number of times.
func ReleaseDataDirs(dir string) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	ms, err := mounts()
	if err != nil {
		return err
	}
	var errs []error
	for i := len(ms) - 1; i >= 0; i-- { // the latest mounts first, should one hide another
		m := ms[i]
		rel, err := filepath.Rel(dir, m.point)
		if err != nil || !strings.HasPrefix(m.source, "/dev/loop") {
			continue
		}
		if parts := strings.Split(rel, string(filepath.Separator)); len(parts) != 2 || parts[1] != "data" || parts[0] == ".." {
			continue
		}
		if mounted, _ := isMountPoint(m.point); mounted {
			errs = append(errs, unmount(m.point))
		}
	}
	// mount -o loop detaches its device at unmount (autoclear); this catches one set up by hand, or one a
	// lazy unmount still holds, which then goes as soon as it is free.
	out, err := exec.Command("losetup", "--list", "--noheadings", "--raw", "--output", "NAME,BACK-FILE").Output()
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("losetup --list: %w", err))...)
	}
	images := filepath.Join(dir, "faults") + string(filepath.Separator)
	for _, line := range strings.Split(string(out), "\n") {
		dev, back, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok || !strings.HasPrefix(unescapeMount(back), images) {
			continue
		}
		if err := run("losetup", "--detach", dev); err != nil && !strings.Contains(err.Error(), "No such device") {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// CleanupFaults undoes what the faults in this file may have left in the cluster in dir, so that it runs as
// `up` made it: paused hosts continue, netem disciplines and the rules of Loss and DropInbound go, data dirs
// on loop filesystems move back (RestoreDataDir, which restarts their hosts), and ReleaseDataDirs catches
// whatever is left. Partition's rules stay: they carry no mark, and Down removes the namespaces anyway. Call
// it before Down; it can be called any number of times, and with no cluster left, it still releases the
// mounts and loop devices.
func CleanupFaults(dir string) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	var errs []error
	if st, err := Load(dir); err == nil {
		for _, h := range st.Hosts {
			errs = append(errs, st.Resume(h.Name))
			if _, err := os.Stat("/run/netns/" + h.Netns); err == nil {
				errs = append(errs, st.ClearNetem(h.Name), st.ClearLoss(h.Name), h.clearTagged("INPUT", oneWayComment))
			}
			if err := st.RestoreDataDir(dir, h.Name); err != nil {
				errs = append(errs, fmt.Errorf("restoring %s's data dir: %w", h.Name, err))
			}
		}
	}
	errs = append(errs, ReleaseDataDirs(dir))
	return errors.Join(errs...)
}
