package dns

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
)

// The node's DNS runs in a process of its own, started by the agent from its own binary and in a session of
// its own, so that it outlives the agent as the pods do: a restarting agent (kill -9 included) finds it still
// answering and adopts it; pods never lose their resolver. Only a changed Corefile replaces it, and only
// teardown stops it. Its files live in one directory (<data_dir>/dns):
//
//	spec.json    what the agent wants (Spec); the process rereads it for the API servers
//	pid          the process's pid
//	running      the hash of the Corefile it serves
//	kubeconfig   the kubernetes plugin's API access, through the process's own forwarder
//	coredns.log  its output

// EnvChild is the environment variable that makes a Skiff binary run the node's DNS process (RunChildIfAsked)
// instead of its command line: its value is the DNS directory.
const EnvChild = "SKIFF_NODE_DNS_DIR"

// Spec is what the agent asks of the node's DNS process.
type Spec struct {
	// Corefile is rendered, with {{.Kubeconfig}} at <dir>/kubeconfig, which the process writes.
	Corefile string `json:"corefile"`
	// Servers are the API servers' host:port, in the order to try; the agent rewrites them as it learns.
	Servers []string `json:"servers"`
	CA      []byte   `json:"ca"`
	// ClientCert is the file with the node's client certificate and key (PEM), which client-go rereads when
	// the agent renews it; Token is a bearer token instead.
	ClientCert string `json:"client_cert,omitempty"`
	Token      string `json:"token,omitempty"`
}

func (s Spec) corefileHash() string {
	sum := sha256.Sum256([]byte(s.Corefile))
	return hex.EncodeToString(sum[:])
}

// KubeconfigPath is where the DNS process writes its API access; the Corefile's kubernetes plugin reads it.
func KubeconfigPath(dir string) string { return filepath.Join(dir, "kubeconfig") }

func writeAtomic(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func readSpec(dir string) (Spec, error) {
	var s Spec
	data, err := os.ReadFile(filepath.Join(dir, "spec.json"))
	if err != nil {
		return s, err
	}
	return s, json.Unmarshal(data, &s)
}

// EnsureChild makes the node's DNS process serve spec: it writes the spec (new servers reach a running
// process that way), adopts a running process that serves the same Corefile, and otherwise stops the old
// one and starts binary (the agent's own) anew. It reports whether it started one, and fails when a new one
// exits at once (its log's tail says why: a plugin's bad argument, say).
func EnsureChild(dir, binary string, spec Spec, logger hclog.Logger) (started bool, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return false, err
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return false, err
	}
	if err := writeAtomic(filepath.Join(dir, "spec.json"), data, 0o600); err != nil {
		return false, err
	}
	pid := childPID(dir)
	if pid > 0 {
		running, _ := os.ReadFile(filepath.Join(dir, "running"))
		if strings.TrimSpace(string(running)) == spec.corefileHash() {
			return false, nil
		}
		logger.Info("the Corefile changed: replacing the node's DNS process", "pid", pid)
		if err := StopChild(dir); err != nil {
			return false, err
		}
	}
	_ = os.Remove(filepath.Join(dir, "running"))
	log, err := os.OpenFile(filepath.Join(dir, "coredns.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return false, err
	}
	defer log.Close()
	cmd := exec.Command(binary)
	cmd.Env = append(os.Environ(), EnvChild+"="+dir)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true} // not killed with the agent's process group
	if err := cmd.Start(); err != nil {
		return false, fmt.Errorf("starting the node's DNS process: %w", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }() // reaped if it ends while this agent runs
	if err := writeAtomic(filepath.Join(dir, "pid"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o600); err != nil {
		return true, err
	}
	// Up when it says what it runs; gone at once means it could not start.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		select {
		case <-exited:
			return true, fmt.Errorf("the node's DNS process exited at start: %s", logTail(filepath.Join(dir, "coredns.log")))
		default:
		}
		if running, _ := os.ReadFile(filepath.Join(dir, "running")); strings.TrimSpace(string(running)) == spec.corefileHash() {
			return true, nil
		}
	}
	return true, fmt.Errorf("the node's DNS process did not start within 10s: %s", logTail(filepath.Join(dir, "coredns.log")))
}

// childPID is the pid of the node's DNS process of dir, or 0 when none runs. A pid the kernel reused for
// another process does not count: the process must carry dir in its environment.
func childPID(dir string) int {
	data, err := os.ReadFile(filepath.Join(dir, "pid"))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 0 {
		return 0
	}
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil || !bytes.Contains(env, []byte("\x00"+EnvChild+"="+dir+"\x00")) && !bytes.HasPrefix(env, []byte(EnvChild+"="+dir+"\x00")) {
		return 0
	}
	if stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err != nil || zombie(stat) {
		return 0
	}
	return pid
}

func zombie(stat []byte) bool {
	i := bytes.LastIndexByte(stat, ')')
	fields := strings.Fields(string(stat[i+1:]))
	return len(fields) > 0 && fields[0] == "Z"
}

// StopChild stops the node's DNS process of dir, if one runs: SIGTERM, then SIGKILL after 5 s. Teardown uses
// it; the agent itself leaves the process running when it stops.
func StopChild(dir string) error {
	pid := childPID(dir)
	if pid == 0 {
		return nil
	}
	_ = syscall.Kill(pid, syscall.SIGTERM)
	for deadline := time.Now().Add(5 * time.Second); childPID(dir) != 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			deadline = time.Now().Add(5 * time.Second)
		}
	}
	_ = os.Remove(filepath.Join(dir, "pid"))
	return nil
}

func logTail(path string) string {
	data, _ := os.ReadFile(path)
	if len(data) > 800 {
		data = data[len(data)-800:]
	}
	return strings.TrimSpace(string(data))
}

// RunChildIfAsked runs the node's DNS process, and exits with its status, when EnvChild is set; otherwise it
// returns at once. The skiff binary calls it first thing.
func RunChildIfAsked() {
	dir := os.Getenv(EnvChild)
	if dir == "" {
		return
	}
	logger := hclog.New(&hclog.LoggerOptions{Name: "node-dns", Output: os.Stderr, Level: hclog.Info})
	if err := runChild(dir, logger); err != nil {
		logger.Error("node DNS stopped", "error", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// runChild serves the spec in dir until SIGTERM or SIGINT: a forwarder to the API servers (reread from the
// spec every two seconds), the kubeconfig through it, and CoreDNS.
func runChild(dir string, logger hclog.Logger) error {
	spec, err := readSpec(dir)
	if err != nil {
		return err
	}
	var mu sync.Mutex
	servers := spec.Servers
	fwd, err := NewForwarder(func() []string {
		mu.Lock()
		defer mu.Unlock()
		return servers
	})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	fwdDone := make(chan struct{})
	go func() { fwd.Serve(ctx); close(fwdDone) }()
	defer func() { stop(); <-fwdDone }()
	go func() {
		for ctx.Err() == nil {
			select {
			case <-ctx.Done():
			case <-time.After(2 * time.Second):
			}
			if s, err := readSpec(dir); err == nil && len(s.Servers) > 0 {
				mu.Lock()
				servers = s.Servers
				mu.Unlock()
			}
		}
	}()
	if err := WriteKubeconfig(KubeconfigPath(dir), fwd.Addr(), spec.CA, Credentials{ClientCert: spec.ClientCert, Token: spec.Token}); err != nil {
		return err
	}
	srv, err := Start(spec.Corefile, logger.Named("k8s"))
	if err != nil {
		return err
	}
	if err := writeAtomic(filepath.Join(dir, "running"), []byte(spec.corefileHash()), 0o600); err != nil {
		_ = srv.Stop()
		return err
	}
	logger.Info("serving", "forwarder", fwd.Addr(), "pid", os.Getpid())
	<-ctx.Done()
	return errors.Join(srv.Stop(), os.Remove(filepath.Join(dir, "running")))
}
