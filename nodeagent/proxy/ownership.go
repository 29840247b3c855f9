package proxy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Ownership of rules on a shared host. Chains outlive their agent when it is killed, and a dead agent's
// rules keep acting on traffic (a stale masquerade chain rewrote every later cluster's pod sources), so an
// agent that starts removes what no live agent owns. Proof of life is an flock: a live agent holds an
// exclusive lock on <data_dir>/iptables.lock for as long as it runs (the kernel drops it when the process
// dies, however it dies). Every chain set carries an owner comment, "skiff:<id>:<data_dir>", on a rule that
// matches nothing of interest (it has no target) at the top of its main chains and on each jump from a
// built-in chain. A chain set is stale when its comment names a data dir that is gone or whose lock is free,
// or when no comment names its owner at all (chains from before owner comments existed).

const lockFile = "iptables.lock"

// OwnerComment is the comment that names the owner of an agent's chains. A data dir iptables cannot carry in
// a comment (too long, or with quotes) is left out; such chains are never judged stale by others.
func OwnerComment(id, dataDir string) string {
	if len(dataDir) > 200 || strings.ContainsAny(dataDir, "\"\\\n'") {
		dataDir = ""
	}
	return "skiff:" + id + ":" + dataDir
}

// ParseOwnerComment is OwnerComment's inverse.
func ParseOwnerComment(comment string) (id, dataDir string, ok bool) {
	rest, ok := strings.CutPrefix(comment, "skiff:")
	if !ok {
		return "", "", false
	}
	id, dataDir, ok = strings.Cut(rest, ":")
	return id, dataDir, ok && id != ""
}

// Ownership is a held claim on an agent's rules; Release gives it up.
type Ownership struct{ file *os.File }

// Claim takes the lock that proves the agent with this data dir is alive, waiting up to wait for a previous
// process of the same agent to let go. It fails when another live agent uses the data dir.
func Claim(dataDir string, wait time.Duration) (*Ownership, error) {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, err
	}
	path := filepath.Join(dataDir, lockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(wait)
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return &Ownership{file: f}, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) || time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("locking %s (is another agent running with this data dir?): %w", path, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Release drops the lock; from then on other agents may remove the chains.
func (o *Ownership) Release() {
	if o != nil && o.file != nil {
		o.file.Close() // closing the only descriptor drops the flock
		o.file = nil
	}
}

// OwnerAlive tells whether the agent that wrote an owner comment with this data dir still runs. Unknown
// data dirs ("") count as alive: nothing is removed without proof.
func OwnerAlive(dataDir string) bool {
	if dataDir == "" {
		return true
	}
	f, err := os.Open(filepath.Join(dataDir, lockFile))
	if errors.Is(err, os.ErrNotExist) {
		return false // data dir gone (a temporary one), or an agent from before the lock existed
	}
	if err != nil {
		return true
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return true
	}
	_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return false
}
