package stats

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Usage is one reading of a container's or the node's use.
type Usage struct {
	// Time is when it was read.
	Time time.Time
	// CPUNanoseconds is the cumulative CPU time used on all cores since the container (or the node) started.
	CPUNanoseconds uint64
	// WorkingSetBytes is the memory in use that the kernel could not reclaim at once: usage less inactive
	// file pages, as cAdvisor and the kubelet count it (and as the OOM killer and evictions see it).
	WorkingSetBytes uint64
}

// Reader reads usage from the kernel. Its paths are fields so that tests can point it at fake trees.
type Reader struct {
	// CgroupRoot is where the cgroup filesystems are mounted: /sys/fs/cgroup. Under cgroup v1 it holds one
	// directory per hierarchy (cpuacct, memory...); under v2 it is the unified hierarchy itself.
	CgroupRoot string
	// ProcRoot is procfs: /proc.
	ProcRoot string
	// Parent is the cgroup that holds the containers: containerd's runc shim puts a container at
	// /<containerd namespace>/<container ID>, so "skiff".
	Parent string
	// V2 says CgroupRoot is a cgroup v2 (unified) hierarchy. NewReader detects it.
	V2 bool

	now func() time.Time // time.Now; tests fix it
}

// NewReader returns a Reader of the host's /sys/fs/cgroup and /proc, for containers under parent, with the
// cgroup version told by the filesystem type of /sys/fs/cgroup: cgroup2 for the unified hierarchy; a tmpfs
// of v1 hierarchies otherwise (hybrid hosts included, whose controllers are still in v1).
func NewReader(parent string) (*Reader, error) {
	const root = "/sys/fs/cgroup"
	var fs unix.Statfs_t
	if err := unix.Statfs(root, &fs); err != nil {
		return nil, fmt.Errorf("detecting the cgroup version: %w", err)
	}
	return &Reader{CgroupRoot: root, ProcRoot: "/proc", Parent: parent, V2: fs.Type == unix.CGROUP2_SUPER_MAGIC}, nil
}

func (r *Reader) clock() time.Time {
	if r.now != nil {
		return r.now()
	}
	return time.Now()
}

// Container reads the usage of the container with the given containerd ID from its cgroup. An error that
// satisfies errors.Is(err, os.ErrNotExist) means the cgroup is gone: the container has exited.
func (r *Reader) Container(id string) (Usage, error) {
	if id == "" || strings.ContainsAny(id, "/\x00") || id == "." || id == ".." {
		return Usage{}, fmt.Errorf("bad container ID %q", id)
	}
	u := Usage{Time: r.clock()}
	var err error
	if r.V2 {
		dir := filepath.Join(r.CgroupRoot, r.Parent, id)
		var usec uint64
		if usec, err = readKey(filepath.Join(dir, "cpu.stat"), "usage_usec"); err != nil {
			return Usage{}, err
		}
		u.CPUNanoseconds = usec * 1000
		u.WorkingSetBytes, err = workingSet(filepath.Join(dir, "memory.current"), filepath.Join(dir, "memory.stat"), "inactive_file")
	} else {
		if u.CPUNanoseconds, err = readUint(filepath.Join(r.CgroupRoot, "cpuacct", r.Parent, id, "cpuacct.usage")); err != nil {
			return Usage{}, err
		}
		dir := filepath.Join(r.CgroupRoot, "memory", r.Parent, id)
		// total_inactive_file, not inactive_file: the hierarchical figure, as cAdvisor takes it.
		u.WorkingSetBytes, err = workingSet(filepath.Join(dir, "memory.usage_in_bytes"), filepath.Join(dir, "memory.stat"), "total_inactive_file")
	}
	if err != nil {
		return Usage{}, err
	}
	return u, nil
}

// userHZ is the unit of /proc/stat's CPU times. The kernel reports them in USER_HZ, which is 100 on every
// Linux architecture the agent runs on (sysconf(_SC_CLK_TCK) would need cgo to ask).
const userHZ = 100

// Node reads the node's usage.
//
// CPU is the busy time of /proc/stat's "cpu" line: user, nice, system, irq, softirq and steal (guest time is
// already in user). Memory is counted as the kubelet counts the node's, from the root cgroup, so that the
// figures agree with what a kubelet would report (and with the memory.available eviction signal): under v1,
// the root memory cgroup's usage less total_inactive_file; under v2, whose root cgroup has no
// memory.current, MemTotal less MemFree from /proc/meminfo, less the root memory.stat's inactive_file, as
// runc computes the root's usage for cAdvisor. MemTotal less MemAvailable would be simpler but reads higher,
// since MemAvailable leaves out part of the page cache and of reclaimable slab.
func (r *Reader) Node() (Usage, error) {
	u := Usage{Time: r.clock()}
	var err error
	if u.CPUNanoseconds, err = r.nodeCPU(); err != nil {
		return Usage{}, err
	}
	if u.WorkingSetBytes, err = r.nodeMemory(); err != nil {
		return Usage{}, err
	}
	return u, nil
}

func (r *Reader) nodeCPU() (uint64, error) {
	path := filepath.Join(r.ProcRoot, "stat")
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	line, _, _ := bytes.Cut(data, []byte("\n"))
	f := strings.Fields(string(line))
	// cpu user nice system idle iowait irq softirq steal [guest guest_nice]
	if len(f) < 9 || f[0] != "cpu" {
		return 0, fmt.Errorf("%s: unexpected first line %q", path, line)
	}
	var ticks uint64
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		v, err := strconv.ParseUint(f[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", path, err)
		}
		ticks += v
	}
	return ticks * uint64(time.Second/userHZ), nil
}

func (r *Reader) nodeMemory() (uint64, error) {
	if !r.V2 {
		dir := filepath.Join(r.CgroupRoot, "memory")
		return workingSet(filepath.Join(dir, "memory.usage_in_bytes"), filepath.Join(dir, "memory.stat"), "total_inactive_file")
	}
	meminfo, err := readMeminfo(filepath.Join(r.ProcRoot, "meminfo"))
	if err != nil {
		return 0, err
	}
	total, free := meminfo["MemTotal"], meminfo["MemFree"]
	if total == 0 {
		return 0, fmt.Errorf("%s: no MemTotal", filepath.Join(r.ProcRoot, "meminfo"))
	}
	inactive, err := readKey(filepath.Join(r.CgroupRoot, "memory.stat"), "inactive_file")
	if errors.Is(err, os.ErrNotExist) {
		// Kernels before 5.x have no root memory.stat; the system-wide figure is the same count.
		inactive, err = meminfo["Inactive(file)"], nil
	}
	if err != nil {
		return 0, err
	}
	return subtract(total-min(free, total), inactive), nil
}

// workingSet is usage less the inactive file pages named by key in the stat file, never below zero.
func workingSet(usagePath, statPath, key string) (uint64, error) {
	usage, err := readUint(usagePath)
	if err != nil {
		return 0, err
	}
	inactive, err := readKey(statPath, key)
	if err != nil {
		return 0, err
	}
	return subtract(usage, inactive), nil
}

func subtract(a, b uint64) uint64 {
	if b > a {
		return 0
	}
	return a - b
}

// readUint reads a file that holds one number ("max" is not one: callers read only counters).
func readUint(path string) (uint64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return v, nil
}

// readKey reads the value of key from a flat keyed file of "key value" lines (memory.stat, cpu.stat).
func readKey(path, key string) (uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if !ok || k != key {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %s: %w", path, key, err)
		}
		return n, nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	return 0, fmt.Errorf("%s: no %s", path, key)
}

// readMeminfo reads /proc/meminfo into bytes by field name ("MemTotal:  16384 kB").
func readMeminfo(path string) (map[string]uint64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for line := range strings.Lines(string(data)) {
		name, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", path, name, err)
		}
		if len(f) > 1 && f[1] == "kB" {
			v *= 1024
		}
		out[name] = v
	}
	return out, nil
}
