package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/internal/proctest"

	"github.com/skiff-dev/skiff/internal/freeport"
)

// `skiff dev` runs a one-server cluster; the operator commands work against it end to end: list-peers,
// members, snapshot save, inspect and restore, and clear errors for bad requests.
func TestDevServerOperatorCommands(t *testing.T) {
	parallel(t)
	bin := proctest.Binary(t)
	dir := t.TempDir()
	// No node agent: this test is about the operator commands (TestDevRunsAPod covers the agent).
	cmd, exited := startDev(t, bin, dir, "-runtime", "none")
	kubeconfig := filepath.Join(dir, "admin.kubeconfig")
	run := func(args ...string) (string, error) {
		c := exec.Command(bin, args...)
		c.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig)
		out, err := c.CombinedOutput()
		return string(out), err
	}
	proctest.WaitFor(t, "dev cluster to answer list-peers", 30*time.Second, func() error {
		out, err := run("operator", "raft", "list-peers")
		if err != nil || !strings.Contains(out, "leader") {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	if out, err := run("operator", "members"); err != nil || !strings.Contains(out, "dev") || !strings.Contains(out, "alive") {
		t.Fatalf("members: %v\n%s", err, out)
	}
	snap := filepath.Join(t.TempDir(), "backup.snap")
	if out, err := run("operator", "snapshot", "save", snap); err != nil {
		t.Fatalf("save: %v\n%s", err, out)
	}
	out, err := run("operator", "snapshot", "inspect", snap)
	if err != nil || !strings.Contains(out, "/skiff/pki") {
		t.Fatalf("inspect: %v\n%s", err, out)
	}
	if out, err := run("operator", "snapshot", "restore", snap); err != nil || !strings.Contains(out, "restored") {
		t.Fatalf("restore: %v\n%s", err, out)
	}
	// A corrupt file is refused before anything is sent, and by the server if sent anyway.
	data, _ := os.ReadFile(snap)
	data[len(data)/2] ^= 0xff
	bad := snap + ".bad"
	os.WriteFile(bad, data, 0o600)
	if out, err := run("operator", "snapshot", "restore", bad); err == nil || !strings.Contains(out, "corrupt snapshot") {
		t.Fatalf("corrupt restore: %v\n%s", err, out)
	}
	if out, err := run("operator", "raft", "remove-peer", "nobody"); err == nil || !strings.Contains(out, "HTTP 404") {
		t.Fatalf("remove unknown peer: %v\n%s", err, out)
	}
	// The server still serves after all that.
	if out, err := run("operator", "raft", "list-peers"); err != nil || !strings.Contains(out, "leader") {
		t.Fatalf("list-peers after restore: %v\n%s", err, out)
	}
	// A debug bundle holds every part, each with what it should.
	bundle := filepath.Join(t.TempDir(), "debug.tar.gz")
	if out, err := run("operator", "debug", "-output", bundle); err != nil || strings.Contains(out, "errors.txt") {
		t.Fatalf("debug: %v\n%s", err, out)
	}
	parts := readTarGz(t, bundle)
	for file, want := range map[string]string{
		"health.json": `"healthy":true`, "raft-peers.json": `"state":"leader"`, "raft-state.json": `"last_log_index"`,
		"members.json": `"dev"`, "server.log": "raft", "metrics.txt": "skiff_", "version.json": "gitVersion",
		"goroutines.txt": "goroutine ", "heap.pprof": "",
	} {
		data, ok := parts[file]
		if !ok || len(data) == 0 || !strings.Contains(string(data), want) {
			t.Errorf("bundle part %s (present %v, %d bytes) lacks %q", file, ok, len(data), want)
		}
	}
	if out, err := run("operator", "debug", "-output", bundle); err == nil {
		t.Fatalf("debug over an existing file succeeded:\n%s", out)
	}
	// SIGTERM exits cleanly.
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Fatalf("skiff dev exited with %v after SIGTERM", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("skiff dev did not exit within 20s of SIGTERM")
	}
}

// startDev runs `skiff dev` on dir (with extra flags) on a free port, in its own process group. At cleanup the
// group is killed and, on failure, the output logged. exited receives the process's exit.
func startDev(t *testing.T, bin, dir string, extra ...string) (cmd *exec.Cmd, exited chan error) {
	t.Helper()
	port := freeport.Consecutive(t, 3) // dev listens on it (API), on port+1 (Raft) and on port+2 (gossip)
	args := append([]string{"dev", "-data-dir", dir, "-api-port", fmt.Sprint(port), "-log-level", "warn"}, extra...)
	cmd = exec.Command(bin, args...)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited = make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		if t.Failed() {
			t.Logf("skiff dev output:\n%s", logs.String())
		}
	})
	return cmd, exited
}

// A newcomer's first steps: `skiff dev` runs a node agent beside its server, with a busybox image that needs
// no registry, and `kubectl run` gets a pod Running.
func TestDevRunsAPod(t *testing.T) {
	parallelOnHostNetwork(t)
	requireRealRuntime(t)
	bin := proctest.Binary(t)
	dir, err := os.MkdirTemp("", "skiff-dev-e2e-") // short: containerd's socket lives under it
	if err != nil {
		t.Fatal(err)
	}
	// Registered first, so it runs after startDev's cleanup has killed the process: the dev node's pods outlive
	// the process when the data dir is given; remove them and the dir.
	t.Cleanup(func() {
		if out, err := exec.Command(bin, "agent", "-name", "dev", "-data-dir", filepath.Join(dir, "agent"), "-teardown").CombinedOutput(); err != nil {
			t.Errorf("teardown: %v\n%s", err, out)
		}
		os.RemoveAll(dir)
	})
	startDev(t, bin, dir)
	k := kubectl{t: t, kubeconfig: filepath.Join(dir, "admin.kubeconfig")}
	proctest.WaitFor(t, "the dev node Ready", 60*time.Second, func() error {
		if out, err := k.run("get", "node", "dev", "--no-headers"); err != nil || !strings.Contains(out, " Ready ") {
			return fmt.Errorf("not yet: %s", out)
		}
		return nil
	})
	k.ok("run", "hello", "--image=skiff.local/busybox:1", "--", "sleep", "3600")
	proctest.WaitFor(t, "hello Running", 60*time.Second, func() error {
		if s := k.podStatusColumn("hello"); s != "Running" {
			return fmt.Errorf("STATUS %s", s)
		}
		return nil
	})
	mustContain(t, "hello's events", k.ok("describe", "pod", "hello"), "already present on machine", "Started")

	// A Deployment rolls out, rolls forward on a template change and back with `rollout undo`, with the stock
	// kubectl reading revisions from the controller's annotations.
	k.ok("create", "deployment", "web", "--image=skiff.local/busybox:1", "--replicas=2", "--", "sleep", "3600")
	k.ok("rollout", "status", "deployment/web", "--timeout=120s")
	k.ok("set", "env", "deployment/web", "STAGE=two")
	k.ok("rollout", "status", "deployment/web", "--timeout=120s")
	k.ok("rollout", "undo", "deployment/web")
	k.ok("rollout", "status", "deployment/web", "--timeout=120s")
	history := k.ok("rollout", "history", "deployment/web")
	mustContain(t, "rollout history", history, "\n2 ", "\n3 ")
	if strings.Contains(history, "\n1 ") {
		t.Fatalf("revision 1 should have become 3 after the undo:\n%s", history)
	}
	if env := k.ok("get", "deployment", "web", "-o", "jsonpath={.spec.template.spec.containers[0].env}"); env != "" {
		t.Fatalf("after the undo the template still has env %s", env)
	}
	proctest.WaitFor(t, "two Running web pods", 60*time.Second, func() error {
		out := k.ok("get", "pods", "-l", "app=web", "--field-selector", "status.phase=Running", "-o", "name")
		if n := len(strings.Fields(out)); n != 2 {
			return fmt.Errorf("%d Running", n)
		}
		return nil
	})

	// `kubectl expose --type=LoadBalancer` works out of the box: the dev cluster's pool gives an address that
	// answers on this machine.
	k.ok("create", "deployment", "site", "--image=skiff.local/busybox:1", "--", "sh", "-c",
		"mkdir -p /www && echo dev-site > /www/index.html && exec httpd -f -p 8080 -h /www")
	k.ok("rollout", "status", "deployment/site", "--timeout=120s")
	k.ok("expose", "deployment", "site", "--type=LoadBalancer", "--port=80", "--target-port=8080")
	var ip string
	proctest.WaitFor(t, "site's EXTERNAL-IP", 60*time.Second, func() error {
		ip = k.ok("get", "svc", "site", "-o", "jsonpath={.status.loadBalancer.ingress[0].ip}")
		if ip == "" {
			return fmt.Errorf("pending")
		}
		return nil
	})
	// Until the proxy's rules for the address are in, the request leaves the machine: this sandbox's egress
	// proxy answers it with a 404 and no body (Server: keryx). Twice in CI runs that answer still came after
	// two minutes, with the address's rules in: a failure says what each hop of the path says.
	reachable := time.Now()
	var lastErr error
	for deadline := reachable.Add(120 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
		body, err := httpGet("http://" + ip + "/")
		if err == nil && strings.TrimSpace(body) != "dev-site" {
			err = fmt.Errorf("answered %q", body)
		}
		if lastErr = err; err == nil {
			break
		}
	}
	if lastErr != nil {
		t.Fatalf("site at %s from this machine: %v\n%s", ip, lastErr, devPathDiagnostics(k, ip))
	}
	t.Logf("site answered at its address %v after its EXTERNAL-IP was set", time.Since(reachable).Round(time.Second))
}

// devPathDiagnostics says which hop of the path from this machine to a LoadBalancer address fails: what the
// pod answers itself, the host's route to the address, the nat rules of the built-in chains and of the
// cluster's chains that name the address, and conntrack's entries for it.
func devPathDiagnostics(k kubectl, ip string) string {
	var b strings.Builder
	podIP := k.ok("get", "pods", "-l", "app=site", "-o", "jsonpath={.items[*].status.podIP}")
	direct, err := httpGet("http://" + strings.Fields(podIP + " none")[0] + ":8080/")
	fmt.Fprintf(&b, "the pod at %s answered %q, %v\n", podIP, direct, err)
	route, _ := exec.Command("ip", "route", "get", ip).CombinedOutput()
	fmt.Fprintf(&b, "ip route get %s: %s", ip, route)
	saved, err := exec.Command("iptables-save", "-t", "nat").CombinedOutput()
	fmt.Fprintf(&b, "iptables-save -t nat (%v), the built-in chains and the chains of the address's cluster:\n", err)
	owner := ""
	for _, line := range strings.Split(string(saved), "\n") {
		if strings.Contains(line, " -d "+ip+"/32 ") {
			if f := strings.Fields(line); len(f) > 1 {
				owner, _, _ = strings.Cut(strings.TrimPrefix(f[1], "SKIFF-"), "-")
			}
		}
	}
	for _, line := range strings.Split(string(saved), "\n") {
		builtin := strings.HasPrefix(line, "-A OUTPUT ") || strings.HasPrefix(line, "-A PREROUTING ") || strings.HasPrefix(line, "-A POSTROUTING ")
		if builtin || owner != "" && strings.Contains(line, "SKIFF-"+owner+"-") && !strings.HasPrefix(line, ":") {
			b.WriteString("  " + line + "\n")
		}
	}
	ct, err := exec.Command("conntrack", "-L", "-d", ip).CombinedOutput()
	fmt.Fprintf(&b, "conntrack -L -d %s (%v):\n%s", ip, err, ct)
	return b.String()
}

// readTarGz reads every file of a tar.gz.
func readTarGz(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	files := map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = data
	}
}

// A `skiff dev` killed outright (a crash, an OOM kill) leaves its pods, their network namespaces, its
// containerd and its bridge with 10.244.0.1/24, the gateway of every dev node's pod CIDR. Two are killed with
// kill -9 in a row, each with a web pod running; each next one removes what they left (nodeagent's
// deadagents.go), and its own pod, which host-local gives the same IP as the dead ones', answers from the
// host, with its own page: a dead bridge would have the host route that IP to a dead dev's pod, or nowhere.
func TestDevAfterKilledDevs(t *testing.T) {
	parallelOnHostNetwork(t)
	requireRealRuntime(t)
	bin := proctest.Binary(t)
	var agentDirs []string
	for round := 1; round <= 3; round++ {
		dir, err := os.MkdirTemp("", "skiff-dev-e2e-")
		if err != nil {
			t.Fatal(err)
		}
		agentDir := filepath.Join(dir, "agent")
		agentDirs = append(agentDirs, agentDir)
		t.Cleanup(func() { // after startDev's cleanup: see TestDevRunsAPod
			if out, err := exec.Command(bin, "agent", "-name", "dev", "-data-dir", agentDir, "-teardown").CombinedOutput(); err != nil {
				t.Errorf("teardown of %s: %v\n%s", dir, err, out)
			}
			os.RemoveAll(dir)
		})
		cmd, exited := startDev(t, bin, dir)
		k := kubectl{t: t, kubeconfig: filepath.Join(dir, "admin.kubeconfig")}
		proctest.WaitFor(t, "the dev node Ready", 90*time.Second, func() error {
			if out, err := k.run("get", "node", "dev", "--no-headers"); err != nil || !strings.Contains(out, " Ready ") {
				return fmt.Errorf("not yet: %s", out)
			}
			return nil
		})
		k.waitForAPI("default")
		page := fmt.Sprintf("dev-round-%d", round)
		manifest := filepath.Join(dir, "web.yaml")
		if err := os.WriteFile(manifest, []byte(fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  containers:
  - name: httpd
    image: skiff.local/busybox:1
    command: ["sh", "-c", "mkdir -p /www && echo %s > /www/index.html && exec httpd -f -p 8080 -h /www"]
    readinessProbe:
      httpGet: {port: 8080}
      periodSeconds: 1
`, page)), 0o600); err != nil {
			t.Fatal(err)
		}
		k.ok("apply", "-f", manifest)
		k.ok("wait", "--for=condition=Ready", "pod/web", "--timeout=90s")
		ip := k.ok("get", "pod", "web", "-o", "jsonpath={.status.podIP}")
		proctest.WaitFor(t, "round "+fmt.Sprint(round)+"'s pod answering from the host", 20*time.Second, func() error {
			c := http.Client{Timeout: 2 * time.Second}
			resp, err := c.Get("http://" + net.JoinHostPort(ip, "8080") + "/")
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if got := strings.TrimSpace(string(body)); got != page {
				return fmt.Errorf("%s answered %q, want %q", ip, got, page)
			}
			return nil
		})
		if round == 3 {
			break
		}
		cmd.Process.Kill() // the dev process alone: its containerd and pods run on, as after a crash
		err = <-exited
		exited <- err // for startDev's cleanup
	}
	// The killed devs' bridges are gone; the live one's names its owner.
	out, err := exec.Command("ip", "-d", "link", "show", "type", "bridge").CombinedOutput()
	if err != nil {
		t.Fatalf("ip link: %v\n%s", err, out)
	}
	for i, dir := range agentDirs {
		if has := strings.Contains(string(out), ":"+dir+"\n"); has != (i == 2) {
			t.Errorf("a bridge owned by dev %d's agent (%s) present: %v, want %v:\n%s", i+1, dir, has, i == 2, out)
		}
	}
}
