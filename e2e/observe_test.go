package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	"k8s.io/streaming/pkg/httpstream"

	"github.com/skiff-dev/skiff/internal/freeport"
	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/internal/testimages"
	"github.com/skiff-dev/skiff/localcluster"
)

// observeYAML holds the pods TestLocalObserve reads, all on agent-2, created together so that they start
// in parallel.
const observeYAML = `apiVersion: v1
kind: Pod
metadata: {name: talker, labels: {app: talker}}
spec:
  nodeName: agent-2
  containers:
  - name: c
    image: skiff.local/busybox:1
    # sleep 3601 is how the debug container recognizes its target's process.
    command: ["sh", "-c", "for i in 1 2 3 4 5; do echo line-$i; done; exec sleep 3601"]
---
apiVersion: v1
kind: Pod
metadata: {name: duo}
spec:
  nodeName: agent-2
  containers:
  - {name: a, image: skiff.local/busybox:1, command: ["sh", "-c", "echo line-a-1; echo line-a-2; exec sleep 3600"]}
  - {name: b, image: skiff.local/busybox:1, command: ["sh", "-c", "echo line-b-1; echo line-b-2; exec sleep 3600"]}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: dep}
spec:
  replicas: 1
  selector: {matchLabels: {app: dep}}
  template:
    metadata: {labels: {app: dep}}
    spec:
      nodeName: agent-2
      containers: [{name: c, image: skiff.local/busybox:1, command: ["sh", "-c", "echo from-deployment; exec sleep 3600"]}]
---
apiVersion: v1
kind: Pod
metadata: {name: ticker}
spec:
  nodeName: agent-2
  containers:
  - name: c
    image: skiff.local/busybox:1
    # The host's uptime when the line was written (containers share the host's clocks): the test compares it
    # with the uptime when kubectl logs -f delivers the line. busybox's date has no sub-second format.
    command: ["sh", "-c", "while :; do read up rest < /proc/uptime; echo tick $up; usleep 100000; done"]
---
apiVersion: v1
kind: Pod
metadata: {name: crashy}
spec:
  nodeName: agent-2
  restartPolicy: Always
  containers:
  - name: c
    image: skiff.local/busybox:1
    # Run 1 exits 1; run 2 stays up: then --previous is run 1's output and the current log run 2's.
    command: ["sh", "-c", "n=$(cat /state/n 2>/dev/null || echo 0); n=$((n+1)); echo $n > /state/n; echo run $n; if [ $n -ge 2 ]; then exec sleep 3600; fi; exit 1"]
    volumeMounts: [{name: state, mountPath: /state}]
  volumes: [{name: state, emptyDir: {}}]
---
apiVersion: v1
kind: Pod
metadata: {name: rotator}
spec:
  nodeName: agent-2
  containers:
  - name: c
    image: skiff.local/busybox:1
    # /tmp/go: 12 MiB of 101-byte lines (more than the default container_log_max_size of 10Mi), then a
    # marker; /tmp/go2, once the test has seen the log rotated: 20 more lines and a final marker.
    command: ["sh", "-c", "echo waiting-for-go; until [ -e /tmp/go ]; do sleep 0.2; done; yes ` + rotatorFiller + ` | head -c 12582912; echo; echo rotation-marker; until [ -e /tmp/go2 ]; do sleep 0.2; done; for i in $(seq 1 20); do echo after-rotation-$i; done; echo final-marker; exec sleep 3600"]
---
apiVersion: v1
kind: Pod
metadata: {name: web, labels: {app: web}}
spec:
  nodeName: agent-2
  containers:
  - name: web
    image: skiff.test/server:1
    imagePullPolicy: Never
    ports: [{name: http, containerPort: 8080}]
    readinessProbe: {httpGet: {path: /ready, port: http}, periodSeconds: 1}
    volumeMounts: [{name: data, mountPath: /data}]
  volumes: [{name: data, emptyDir: {}}]
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: http}]
---
apiVersion: v1
kind: Pod
metadata: {name: shell}
spec:
  nodeName: agent-2
  containers: [{name: c, image: skiff.local/busybox:1, command: ["sh"], stdin: true, tty: true}]
---
apiVersion: v1
kind: Pod
metadata: {name: nopull}
spec:
  nodeName: agent-2
  containers: [{name: c, image: skiff.test/does-not-exist:1}]
`

// rotatorFiller is the rotator's line: 100 characters, 101 bytes with its newline.
const rotatorFiller = "filler-0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijklmnopqrstuvwxyz0123456789abcdefghijk"

// TestLocalObserve checks kubectl's windows into running pods on `skiff local` (3 servers, 2 agents on
// containerd) with the stock kubectl: logs (tail, since, timestamps, containers, selectors, a Deployment),
// logs -f (a line arrives within a second of being written), --previous after a crash, logs through a
// rotation, exec with stdin and exit codes, exec -it and attach on a terminal, port-forward (pod and Service,
// two ports, concurrent requests, a 100 MiB download), cp both ways, debug with an ephemeral container, top,
// the agent's HTTPS endpoint refusing an anonymous client, bad log requests answered as kube-apiserver does,
// and logs and exec through a kill -9 of the pods' agent and of the Raft leader.
//
// kubectl uses a Raft follower's context and the pods run on agent-2, so that every stream goes kubectl ->
// a server that is not the leader -> the agent's endpoint (port 10250) -> the container: no stream may
// depend on the leader. (Agents join the gossip pool through server-1 alone; any server reaches any agent on
// the bridge.)
func TestLocalObserve(t *testing.T) {
	parallel(t)
	requireRealRuntime(t)
	dir, err := os.MkdirTemp("", "skiff-observe-")
	if err != nil {
		t.Fatal(err)
	}
	bin := proctest.Binary(t)
	imageDir := filepath.Join(dir, "images")
	if err := os.MkdirAll(imageDir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := testimages.WriteServerTarball("skiff.test/server:1", filepath.Join(imageDir, "server.tar")); err != nil {
		t.Fatal(err)
	}
	st := upLocalCluster(t, bin, dir, "--images", imageDir)
	admin := kubectl{t: t, kubeconfig: st.Kubeconfig(dir)}
	admin.waitNodeHealth("agent-1", "True/", 60*time.Second)
	admin.waitNodeHealth("agent-2", "True/", 60*time.Second)

	// kubectl works through a copy of the cluster kubeconfig (a context per server), on a follower's context.
	leader := raftLeader(t, bin, st.Kubeconfig(dir))
	follower := "server-2"
	if leader == follower {
		follower = "server-3"
	}
	k := kubectl{t: t, kubeconfig: filepath.Join(dir, "observe.kubeconfig")}
	if err := os.WriteFile(k.kubeconfig, []byte(readFile(t, localcluster.ClusterKubeconfig(dir))), 0o600); err != nil {
		t.Fatal(err)
	}
	k.ok("config", "use-context", follower)
	k.waitForAPI("default")
	t.Logf("leader %s; kubectl on %s's context; pods on agent-2", leader, follower)
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := k.run("describe", "pods")
			t.Logf("kubectl describe pods:\n%s", out)
		}
	})
	applyYAML(t, k, observeYAML)
	k.ok("wait", "--for=condition=Ready", "pod/talker", "pod/duo", "pod/ticker", "pod/rotator", "pod/web", "pod/shell", "--timeout=120s")
	k.ok("rollout", "status", "deployment/dep", "--timeout=120s")
	five := "line-1\nline-2\nline-3\nline-4\nline-5\n"

	t.Run("logs", func(t *testing.T) {
		k := k.withT(t)
		future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
		// With --all-containers kubectl reads the containers one after another, in no set order.
		a, b := "line-a-1\nline-a-2\n", "line-b-1\nline-b-2\n"
		pa, pb := "[pod/duo/a] line-a-1\n[pod/duo/a] line-a-2\n", "[pod/duo/b] line-b-1\n[pod/duo/b] line-b-2\n"
		cases := []struct {
			name    string
			args    []string
			wantAny []string
		}{
			{"whole", []string{"talker"}, []string{five}},
			{"tail", []string{"talker", "--tail=2"}, []string{"line-4\nline-5\n"}},
			{"since an hour", []string{"talker", "--since=1h"}, []string{five}},
			{"since a future time", []string{"talker", "--since-time=" + future}, []string{""}},
			{"one of two containers", []string{"duo", "-c", "b"}, []string{b}},
			{"all containers", []string{"duo", "--all-containers"}, []string{a + b, b + a}},
			{"prefix", []string{"duo", "--all-containers", "--prefix"}, []string{pa + pb, pb + pa}},
			{"selector", []string{"-l", "app=talker"}, []string{five}},
			{"deployment", []string{"deploy/dep"}, []string{"from-deployment\n"}},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				if got := k.withT(t).stdout(append([]string{"logs"}, tc.args...)...); !slices.Contains(tc.wantAny, got) {
					t.Fatalf("kubectl logs %s:\n%q\nwant one of\n%q", strings.Join(tc.args, " "), got, tc.wantAny)
				}
			})
		}
		t.Run("timestamps", func(t *testing.T) {
			out := k.withT(t).stdout("logs", "talker", "--timestamps")
			lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			if len(lines) != 5 {
				t.Fatalf("kubectl logs --timestamps: %d lines:\n%s", len(lines), out)
			}
			for i, line := range lines {
				stamp, text, _ := strings.Cut(line, " ")
				at, err := time.Parse(time.RFC3339Nano, stamp)
				if err != nil || text != fmt.Sprintf("line-%d", i+1) || time.Since(at) > time.Hour || time.Until(at) > time.Minute {
					t.Fatalf("line %d of kubectl logs --timestamps is %q (%v); want an RFC 3339 time of the last hour, a space, line-%d", i+1, line, err, i+1)
				}
			}
		})
	})

	t.Run("follow", func(t *testing.T) {
		follow := k.withT(t).start("logs", "-f", "ticker", "--tail=1")
		// The stream is established once its first line arrives; every line written after that must arrive
		// within a second.
		var established float64
		var fresh []procLine
		proctest.WaitFor(t, "30 ticks written after kubectl logs -f had its first line", 60*time.Second, func() error {
			lines := follow.lines()
			if len(lines) == 0 {
				return fmt.Errorf("no line yet; output %q", follow.tail(300))
			}
			established, fresh = lines[0].at, nil
			for _, l := range lines {
				if written := tickTime(t, l.text); written > established {
					fresh = append(fresh, l)
				}
			}
			if len(fresh) < 30 {
				return fmt.Errorf("%d fresh ticks", len(fresh))
			}
			return nil
		})
		var worst float64
		for _, l := range fresh {
			worst = max(worst, l.at-tickTime(t, l.text))
		}
		if worst >= 1 {
			t.Fatalf("a tick reached kubectl logs -f %.2f s after it was written; want under 1 s", worst)
		}
		t.Logf("%d ticks followed, the slowest %.0f ms after it was written", len(fresh), worst*1000)
	})

	t.Run("previous", func(t *testing.T) {
		k := k.withT(t)
		proctest.WaitFor(t, "crashy restarted and running", 120*time.Second, func() error {
			p := k.pod("crashy")
			if len(p.Status.ContainerStatuses) == 0 {
				return fmt.Errorf("no container status")
			}
			if cs := p.Status.ContainerStatuses[0]; cs.RestartCount < 1 || cs.State.Running == nil {
				return fmt.Errorf("restarts %d, running %v", cs.RestartCount, cs.State.Running != nil)
			}
			return nil
		})
		if got := k.stdout("logs", "crashy", "--previous"); got != "run 1\n" {
			t.Fatalf("kubectl logs --previous: %q, want the crashed run's %q", got, "run 1\n")
		}
		if got := k.stdout("logs", "crashy"); got != "run 2\n" {
			t.Fatalf("kubectl logs: %q, want the current run's %q", got, "run 2\n")
		}
	})

	t.Run("rotation", func(t *testing.T) {
		k := k.withT(t)
		uid := k.pod("rotator").Metadata.UID
		follow := k.start("logs", "-f", "rotator")
		follow.waitOutput(t, "waiting-for-go", 60*time.Second)
		k.ok("exec", "rotator", "--", "touch", "/tmp/go")
		follow.waitOutput(t, "rotation-marker", 180*time.Second)
		// The agent rotates the file once it is past container_log_max_size: a second log file of the pod
		// appears in its data dir.
		agentData := filepath.Join(dir, "agent-2", "data")
		proctest.WaitFor(t, "rotator's log rotated", 120*time.Second, func() error {
			if files := podLogFiles(agentData, uid); len(files) < 2 {
				return fmt.Errorf("log files of pod %s under %s: %v", uid, agentData, files)
			}
			return nil
		})
		t.Logf("rotated: %v", podLogFiles(agentData, uid))
		k.ok("exec", "rotator", "--", "touch", "/tmp/go2")
		follow.waitOutput(t, "final-marker", 60*time.Second)
		// Nothing was lost: every filler line, then the lines written after the rotation, in order.
		var filler int
		var after []string
		for _, l := range follow.lines() {
			switch {
			case l.text == rotatorFiller:
				filler++
			case strings.HasPrefix(l.text, "after-rotation-") || l.text == "final-marker":
				after = append(after, l.text)
			}
		}
		if want := 12582912 / (len(rotatorFiller) + 1); filler < want {
			t.Fatalf("kubectl logs -f delivered %d whole filler lines; the container wrote %d", filler, want)
		}
		var want []string
		for i := 1; i <= 20; i++ {
			want = append(want, fmt.Sprintf("after-rotation-%d", i))
		}
		if want = append(want, "final-marker"); !slices.Equal(after, want) {
			t.Fatalf("kubectl logs -f after the rotation delivered %q; want %q", after, want)
		}
		if got := k.stdout("logs", "rotator", "--tail=1"); got != "final-marker\n" {
			t.Fatalf("kubectl logs --tail=1 after the rotation: %q", got)
		}
	})

	t.Run("exec", func(t *testing.T) {
		k := k.withT(t)
		input := make([]byte, 256<<10)
		rand.Read(input)
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, "kubectl", "--kubeconfig", k.kubeconfig, "exec", "-i", "talker", "-c", "c", "--", "sh", "-c", "cat; exit 3")
		var stdout, stderr bytes.Buffer
		cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(input), &stdout, &stderr
		err := cmd.Run()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 3 {
			t.Fatalf("kubectl exec of `cat; exit 3`: %v, want exit status 3\n%s", err, stderr.String())
		}
		if !bytes.Equal(stdout.Bytes(), input) {
			t.Fatalf("kubectl exec -i: %d bytes out for %d in, or different bytes", stdout.Len(), len(input))
		}
		out := k.fails("exec", "talker", "-c", "c", "--", "/no/such/binary")
		if !strings.Contains(out, "/no/such/binary") && !strings.Contains(out, "no such file") {
			t.Fatalf("kubectl exec of a missing binary says %q; want the binary's name or \"no such file\"", out)
		}
		// A client that goes away mid-stream leaves no process behind in the container.
		lingering := k.start("exec", "talker", "-c", "c", "--", "sleep", "4242")
		proctest.WaitFor(t, "the exec'd sleep running", 30*time.Second, func() error {
			if ps := k.stdout("exec", "talker", "-c", "c", "--", "ps"); !strings.Contains(ps, "sleep 4242") {
				return fmt.Errorf("not yet:\n%s", ps)
			}
			return nil
		})
		_ = lingering.cmd.Process.Kill()
		proctest.WaitFor(t, "the exec'd sleep gone after its client was killed", 30*time.Second, func() error {
			if ps := k.stdout("exec", "talker", "-c", "c", "--", "ps"); strings.Contains(ps, "sleep 4242") {
				return fmt.Errorf("still running:\n%s", ps)
			}
			return nil
		})
	})

	t.Run("exec terminal", func(t *testing.T) {
		requireScript(t)
		term := k.withT(t).terminal("exec", "-it", "talker", "-c", "c", "--", "sh")
		term.typeUntil(t, "echo hello-$((6*7))\n", "hello-42", 60*time.Second)
		term.send(t, "exit\n")
		if code := term.exitCode(t, 30*time.Second); code != 0 {
			t.Fatalf("kubectl exec -it exited %d after `exit`:\n%s", code, term.tail(2000))
		}
	})

	t.Run("attach", func(t *testing.T) {
		requireScript(t)
		term := k.withT(t).terminal("attach", "-it", "shell", "-c", "c")
		term.typeUntil(t, "echo attached-$((2+3))\n", "attached-5", 60*time.Second)
	})

	t.Run("port-forward", func(t *testing.T) {
		k := k.withT(t)
		ports := freeport.Take(t, []string{"127.0.0.1"}, 3)
		pf := k.start("port-forward", "pod/web", fmt.Sprintf("%d:8080", ports[0]), fmt.Sprintf("%d:8080", ports[1]))
		pf.waitOutput(t, fmt.Sprintf("Forwarding from 127.0.0.1:%d", ports[0]), 60*time.Second)
		pf.waitOutput(t, fmt.Sprintf("Forwarding from 127.0.0.1:%d", ports[1]), 10*time.Second)
		// 50 requests, 10 at a time, over both local ports, each on a connection (a stream) of its own.
		client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
		var wg sync.WaitGroup
		errs := make(chan error, 50)
		work := make(chan int)
		for range 10 {
			wg.Go(func() {
				for i := range work {
					url := fmt.Sprintf("http://127.0.0.1:%d/", ports[i%2])
					if body, err := getBody(client, url); err != nil || !strings.Contains(string(body), "hostname=web\n") {
						errs <- fmt.Errorf("GET %s: %v %q", url, err, body)
					}
				}
			})
		}
		for i := range 50 {
			work <- i
		}
		close(work)
		wg.Wait()
		close(errs)
		var failed []error
		for err := range errs {
			failed = append(failed, err)
		}
		if len(failed) > 0 {
			t.Fatalf("%d of 50 requests through kubectl port-forward failed:\n%v", len(failed), errors.Join(failed...))
		}

		// 100 MiB, checked against the sum the pod computes.
		out := k.stdout("exec", "web", "--", "sh", "-c", "head -c 104857600 /dev/urandom > /data/big && sha256sum /data/big")
		want, _, _ := strings.Cut(out, " ")
		big := &http.Client{Timeout: 5 * time.Minute}
		start := time.Now()
		resp, err := big.Get(fmt.Sprintf("http://127.0.0.1:%d/file?path=/data/big", ports[0]))
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		n, err := io.Copy(h, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || n != 100<<20 || hex.EncodeToString(h.Sum(nil)) != want {
			t.Fatalf("100 MiB through port-forward: HTTP %d, %d bytes, %v, sha256 %x; the pod's is %s", resp.StatusCode, n, err, h.Sum(nil), want)
		}
		t.Logf("100 MiB through kubectl port-forward in %v", time.Since(start).Round(time.Millisecond))

		svc := k.start("port-forward", "svc/web", fmt.Sprintf("%d:80", ports[2]))
		svc.waitOutput(t, fmt.Sprintf("Forwarding from 127.0.0.1:%d", ports[2]), 60*time.Second)
		if body, err := getBody(client, fmt.Sprintf("http://127.0.0.1:%d/", ports[2])); err != nil || !strings.Contains(string(body), "hostname=web\n") {
			t.Fatalf("GET through kubectl port-forward svc/web: %v %q", err, body)
		}
	})

	// kubectl 1.32 drops the whole connection when one forwarded port fails (client-go closes it on any stream
	// error), so the per-stream contract is checked with client-go's own SPDY dialer: a port nothing listens
	// on gets its error on its own error stream, and another port on the same connection still answers.
	t.Run("port-forward error stays on its stream", func(t *testing.T) {
		cfg, err := clientcmd.BuildConfigFromFlags("", k.kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		transport, upgrader, err := spdy.RoundTripperFor(cfg)
		if err != nil {
			t.Fatal(err)
		}
		u, err := url.Parse(cfg.Host + "/api/v1/namespaces/default/pods/web/portforward")
		if err != nil {
			t.Fatal(err)
		}
		dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, u)
		conn, _, err := dialer.Dial(portforward.PortForwardProtocolV1Name)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		open := func(id, port string) (errStream, data httpstream.Stream) {
			headers := http.Header{}
			headers.Set(corev1.PortHeader, port)
			headers.Set(corev1.PortForwardRequestIDHeader, id)
			headers.Set(corev1.StreamType, corev1.StreamTypeError)
			if errStream, err = conn.CreateStream(headers); err != nil {
				t.Fatal(err)
			}
			headers.Set(corev1.StreamType, corev1.StreamTypeData)
			if data, err = conn.CreateStream(headers); err != nil {
				t.Fatal(err)
			}
			return errStream, data
		}
		closedErr, closedData := open("1", "9999")
		msg, _ := io.ReadAll(closedErr)
		closedData.Close()
		if !strings.Contains(string(msg), "9999") {
			t.Fatalf("the error stream of port 9999 says %q; want the dial error", msg)
		}
		openErr, openData := open("2", "8080")
		defer openErr.Close()
		if _, err := io.WriteString(openData, "GET / HTTP/1.0\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		openData.Close() // our half: the request is sent
		body, err := io.ReadAll(openData)
		if err != nil || !strings.Contains(string(body), "hostname=web") {
			t.Fatalf("port 8080 on the same connection after port 9999 failed: %v %q", err, body)
		}
	})

	t.Run("cp", func(t *testing.T) {
		k := k.withT(t)
		data := make([]byte, 300<<10)
		rand.Read(data)
		local := filepath.Join(t.TempDir(), "in.bin")
		if err := os.WriteFile(local, data, 0o600); err != nil {
			t.Fatal(err)
		}
		k.ok("cp", "-c", "c", local, "talker:/tmp/in.bin")
		sum := sha256.Sum256(data)
		if out := k.stdout("exec", "talker", "-c", "c", "--", "sha256sum", "/tmp/in.bin"); !strings.HasPrefix(out, hex.EncodeToString(sum[:])+" ") {
			t.Fatalf("sha256sum in the pod after kubectl cp in: %q, want %x", out, sum)
		}
		back := filepath.Join(t.TempDir(), "out.bin")
		k.ok("cp", "-c", "c", "talker:/tmp/in.bin", back)
		if got, err := os.ReadFile(back); err != nil || !bytes.Equal(got, data) {
			t.Fatalf("kubectl cp out: %d bytes, %v; not the %d bytes copied in", len(got), err, len(data))
		}
	})

	t.Run("debug", func(t *testing.T) {
		requireScript(t)
		k := k.withT(t)
		term := k.terminal("debug", "talker", "-it", "--image=skiff.local/busybox:1", "--target=c", "-c", "dbg", "--", "sh")
		term.typeUntil(t, "echo debug-ok-$((3*3))\n", "debug-ok-9", 90*time.Second)
		proctest.WaitFor(t, "dbg running in the pod's status", 30*time.Second, func() error {
			out := k.stdout("get", "pod", "talker", "-o", `jsonpath={.status.ephemeralContainerStatuses[?(@.name=="dbg")].state}`)
			if !strings.Contains(out, "running") {
				return fmt.Errorf("ephemeral container status %q", out)
			}
			return nil
		})
		// --target: the debug container sees the target container's processes.
		term.typeUntil(t, "ps | grep -q '[s]leep 3601' && echo target-$((4+4))\n", "target-8", 30*time.Second)
		term.send(t, "exit\n")
		if code := term.exitCode(t, 30*time.Second); code != 0 {
			t.Fatalf("kubectl debug -it exited %d after `exit`:\n%s", code, term.tail(2000))
		}
		proctest.WaitFor(t, "dbg terminated in the pod's status", 30*time.Second, func() error {
			out := k.stdout("get", "pod", "talker", "-o", `jsonpath={.status.ephemeralContainerStatuses[?(@.name=="dbg")].state}`)
			if !strings.Contains(out, "terminated") {
				return fmt.Errorf("ephemeral container status %q", out)
			}
			return nil
		})
	})

	t.Run("top", func(t *testing.T) {
		k := k.withT(t)
		applyYAML(t, k, `apiVersion: v1
kind: Pod
metadata: {name: burner}
spec:
  nodeName: agent-2
  containers:
  - name: c
    image: skiff.local/busybox:1
    command: ["sh", "-c", "while :; do :; done"]
    resources: {requests: {cpu: 250m}, limits: {cpu: 250m}}
`)
		t.Cleanup(func() { k.run("delete", "pod", "burner", "--grace-period=1", "--wait=false") })
		k.ok("wait", "--for=condition=Ready", "pod/burner", "--timeout=120s")
		// Metrics are about 15 s fresh.
		proctest.WaitFor(t, "kubectl top pod burner showing CPU", 90*time.Second, func() error {
			return topCPU(k, "burner", "top", "pod", "burner", "--no-headers")
		})
		proctest.WaitFor(t, "kubectl top nodes showing agent-2's CPU", 90*time.Second, func() error {
			return topCPU(k, "agent-2", "top", "nodes", "--no-headers")
		})
	})

	t.Run("agent endpoint refuses anonymous clients", func(t *testing.T) {
		k := k.withT(t)
		port := strings.TrimSpace(k.stdout("get", "node", "agent-2", "-o", "jsonpath={.status.daemonEndpoints.kubeletEndpoint.Port}"))
		if n, err := strconv.Atoi(port); err != nil || n <= 0 {
			t.Fatalf("agent-2's status.daemonEndpoints.kubeletEndpoint.Port is %q", port)
		}
		agent, _ := st.Host("agent-2")
		from, _ := st.Host(follower)
		for _, path := range []string{"/containerLogs/default/talker/c", "/exec/default/talker/c?command=true&output=1"} {
			url := "https://" + agent.IP + ":" + port + path
			// From a server's host, as the servers reach the agent, with no client certificate.
			cmd := exec.Command("nsenter", "--net=/run/netns/"+from.Netns, "--", "curl", "-sSk", "--max-time", "10", "-o", "/dev/null", "-w", "%{http_code}", url)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			var exit *exec.ExitError
			switch {
			case err == nil:
				if code := stdout.String(); code != "401" && code != "403" {
					t.Fatalf("GET %s without a client certificate: HTTP %s, want 401 or 403", url, code)
				}
			case errors.As(err, &exit) && (exit.ExitCode() == 7 || exit.ExitCode() == 28):
				t.Fatalf("GET %s: nothing answers (curl exit %d): %s", url, exit.ExitCode(), stderr.String())
			case errors.As(err, &exit):
				// The TLS handshake refused a client without a certificate.
				t.Logf("GET %s refused during the handshake: %s", url, strings.TrimSpace(stderr.String()))
			default:
				t.Fatal(err)
			}
		}
	})

	t.Run("bad log requests", func(t *testing.T) {
		k := k.withT(t)
		cfg, err := clientcmd.BuildConfigFromFlags("", k.kubeconfig)
		if err != nil {
			t.Fatal(err)
		}
		client := kubernetes.NewForConfigOrDie(cfg)
		proctest.WaitFor(t, "nopull's container waiting", 60*time.Second, func() error {
			if s := k.podStatusColumn("nopull"); s == "Pending" || s == "" {
				return fmt.Errorf("STATUS %q", s)
			}
			return nil
		})
		// kube-apiserver answers 422 (Invalid) for PodLogOptions that fail validation, 400 for the rest.
		cases := []struct {
			name, pod string
			params    map[string]string
			codes     []int
			wantAny   []string
		}{
			{"negative tailLines", "talker", map[string]string{"tailLines": "-1"}, []int{400, 422}, []string{"tailLines"}},
			{"zero sinceSeconds", "talker", map[string]string{"sinceSeconds": "0"}, []int{400, 422}, []string{"sinceSeconds"}},
			{"sinceSeconds and sinceTime", "talker", map[string]string{"sinceSeconds": "10", "sinceTime": time.Now().UTC().Format(time.RFC3339)},
				[]int{400, 422}, []string{"sinceSeconds"}},
			{"missing pod", "no-such-pod", nil, []int{404}, []string{`"no-such-pod" not found`}},
			{"wrong container", "talker", map[string]string{"container": "x"}, []int{400}, []string{"container x is not valid for pod talker"}},
			{"no container named in a two-container pod", "duo", nil, []int{400}, []string{"a container name must be specified for pod duo, choose one of: [a b]"}},
			{"no previous run", "talker", map[string]string{"previous": "true"}, []int{400}, []string{"not found"}},
			{"not started", "nopull", nil, []int{400}, []string{"ContainerCreating", "waiting to start"}},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				req := client.CoreV1().RESTClient().Get().Namespace("default").Resource("pods").Name(tc.pod).SubResource("log")
				for key, v := range tc.params {
					req = req.Param(key, v)
				}
				// Result.Error decodes the Status the server answered (DoRaw would keep client-go's generic text).
				res := req.Do(context.Background())
				err := res.Error()
				var status apierrors.APIStatus
				if err == nil || !errors.As(err, &status) {
					body, _ := res.Raw()
					t.Fatalf("GET pods/%s/log %v: %v %q; want an API error", tc.pod, tc.params, err, body)
				}
				code, msg := int(status.Status().Code), status.Status().Message
				if !slices.Contains(tc.codes, code) || !slices.ContainsFunc(tc.wantAny, func(w string) bool { return strings.Contains(msg, w) }) {
					t.Fatalf("GET pods/%s/log %v: %d %q; want %v and a message with one of %q", tc.pod, tc.params, code, msg, tc.codes, tc.wantAny)
				}
			})
		}
	})

	// Last: it kills agent-2 and the leader.
	t.Run("agent and leader killed", func(t *testing.T) {
		k := k.withT(t)
		stillWorks := func(after string) {
			t.Helper()
			start := time.Now()
			proctest.WaitFor(t, "kubectl logs and exec "+after, 90*time.Second, func() error {
				if out, err := k.run("logs", "talker", "-c", "c"); err != nil || out != five {
					return fmt.Errorf("kubectl logs: %v %q", err, out)
				}
				if out, err := k.run("exec", "talker", "-c", "c", "--", "sh", "-c", "echo alive-$((1+1))"); err != nil || out != "alive-2\n" {
					return fmt.Errorf("kubectl exec: %v %q", err, out)
				}
				return nil
			})
			t.Logf("logs and exec work %v %s", time.Since(start).Round(100*time.Millisecond), after)
		}
		down := uptime()
		if err := st.Kill("agent-2"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second) // the ticker writes while its agent is down
		up := uptime()
		if err := st.Start(dir, "agent-2"); err != nil {
			t.Fatal(err)
		}
		k.waitNodeHealth("agent-2", "True/", 60*time.Second)
		stillWorks("after agent-2's kill -9 and restart")
		var duringDown int
		for _, line := range strings.Split(k.stdout("logs", "ticker"), "\n") {
			if w, err := strconv.ParseFloat(strings.TrimPrefix(line, "tick "), 64); err == nil && w > down && w < up {
				duringDown++
			}
		}
		t.Logf("the ticker's log holds %d lines written while agent-2 was down", duringDown)

		leader := raftLeader(t, bin, k.kubeconfig)
		if leader == follower {
			for _, s := range []string{"server-1", "server-2", "server-3"} {
				if s != leader {
					k.ok("config", "use-context", s)
					break
				}
			}
		}
		if err := st.Kill(leader); err != nil {
			t.Fatal(err)
		}
		stillWorks("through a surviving server after the leader's kill -9")
	})
}

// withT is k reporting to t: a subtest must not fail its parent from its own goroutine.
func (k kubectl) withT(t *testing.T) kubectl {
	k.t = t
	return k
}

// stdout runs kubectl and returns its standard output alone (warnings go to stderr); it fails the test on
// error.
func (k kubectl) stdout(args ...string) string {
	k.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "kubectl", append([]string{"--kubeconfig", k.kubeconfig}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		k.t.Fatalf("kubectl %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out)
}

// start runs a long-lived kubectl (logs -f, port-forward) in the background.
func (k kubectl) start(args ...string) *bgProc {
	k.t.Helper()
	return startBg(k.t, false, "kubectl", append([]string{"--kubeconfig", k.kubeconfig}, args...)...)
}

// terminal runs kubectl on a pseudo-terminal, under util-linux's script, with stdin piped in by the test.
func (k kubectl) terminal(args ...string) *bgProc {
	k.t.Helper()
	var quoted []string
	for _, a := range append([]string{"kubectl", "--kubeconfig", k.kubeconfig}, args...) {
		quoted = append(quoted, "'"+strings.ReplaceAll(a, "'", `'\''`)+"'")
	}
	return startBg(k.t, true, "script", "-qfec", strings.Join(quoted, " "), "/dev/null")
}

func requireScript(t *testing.T) {
	if _, err := exec.LookPath("script"); err != nil {
		t.Skip("script (util-linux) not installed")
	}
}

// bgProc is a command the test reads while it runs: kubectl logs -f, kubectl port-forward, or a terminal
// session. Its output accumulates, and each complete line of its standard output is kept with the host's
// uptime when it arrived. It is stopped at the end of the test that started it.
type bgProc struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{}
	err   error // Wait's, once done is closed

	mu      sync.Mutex
	out     []byte // stdout and stderr
	arrived []procLine
	partial []byte
}

type procLine struct {
	text string
	at   float64 // the host's uptime at arrival, in seconds
}

func startBg(t *testing.T, withStdin bool, name string, args ...string) *bgProc {
	t.Helper()
	p := &bgProc{name: name + " " + strings.Join(args, " "), cmd: exec.Command(name, args...), done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), "TERM=xterm")
	p.cmd.Stderr = stderrTo{p}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if withStdin {
		if p.stdin, err = p.cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("%s: %v", p.name, err)
	}
	go p.read(stdout)
	t.Cleanup(p.stop)
	return p
}

func (p *bgProc) read(r io.Reader) {
	buf := make([]byte, 64<<10)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			at := uptime()
			p.mu.Lock()
			p.out = append(p.out, buf[:n]...)
			p.partial = append(p.partial, buf[:n]...)
			for {
				i := bytes.IndexByte(p.partial, '\n')
				if i < 0 {
					break
				}
				p.arrived = append(p.arrived, procLine{text: strings.TrimSuffix(string(p.partial[:i]), "\r"), at: at})
				p.partial = p.partial[i+1:]
			}
			p.mu.Unlock()
		}
		if err != nil {
			break
		}
	}
	p.err = p.cmd.Wait()
	close(p.done)
}

// stderrTo adds a process's standard error to its output, not to its lines.
type stderrTo struct{ p *bgProc }

func (s stderrTo) Write(b []byte) (int, error) {
	s.p.mu.Lock()
	defer s.p.mu.Unlock()
	s.p.out = append(s.p.out, b...)
	return len(b), nil
}

func (p *bgProc) lines() []procLine {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.arrived)
}

func (p *bgProc) tail(n int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return string(p.out[max(0, len(p.out)-n):])
}

func (p *bgProc) contains(s string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return bytes.Contains(p.out, []byte(s))
}

// waitOutput waits until want appears in the output.
func (p *bgProc) waitOutput(t *testing.T, want string, timeout time.Duration) {
	t.Helper()
	from := 0 // the output before it has been searched already
	proctest.WaitFor(t, fmt.Sprintf("%q from %s", want, p.name), timeout, func() error {
		p.mu.Lock()
		found := bytes.Contains(p.out[from:], []byte(want))
		from = max(0, len(p.out)-len(want))
		p.mu.Unlock()
		if found {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("exited (%v); output ends %q", p.err, p.tail(500))
		default:
			return fmt.Errorf("output ends %q", p.tail(300))
		}
	})
}

func (p *bgProc) send(t *testing.T, input string) {
	t.Helper()
	if _, err := io.WriteString(p.stdin, input); err != nil {
		t.Fatalf("writing to %s: %v; output ends %q", p.name, err, p.tail(500))
	}
}

// typeUntil types input into a terminal, again every 5 s (it may not be listening yet), until want appears
// in the output.
func (p *bgProc) typeUntil(t *testing.T, input, want string, timeout time.Duration) {
	t.Helper()
	var typed time.Time
	proctest.WaitFor(t, fmt.Sprintf("%q after typing %q into %s", want, input, p.name), timeout, func() error {
		if p.contains(want) {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("exited (%v); output ends %q", p.err, p.tail(500))
		default:
		}
		if time.Since(typed) > 5*time.Second {
			p.send(t, input)
			typed = time.Now()
		}
		return fmt.Errorf("output ends %q", p.tail(300))
	})
}

// exitCode waits for the process to exit and returns its exit status.
func (p *bgProc) exitCode(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("%s still runs after %v; output ends %q", p.name, timeout, p.tail(500))
	}
	var exit *exec.ExitError
	switch {
	case p.err == nil:
		return 0
	case errors.As(p.err, &exit):
		return exit.ExitCode()
	}
	t.Fatalf("%s: %v", p.name, p.err)
	return -1
}

// stop ends the process: SIGTERM (script passes it on to kubectl), then SIGKILL.
func (p *bgProc) stop() {
	if p.stdin != nil {
		p.stdin.Close()
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
		}
	}
}

// uptime is the host's /proc/uptime in seconds: the clock the ticker pod writes into its lines.
func uptime() float64 {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return 0
	}
	f, _ := strconv.ParseFloat(strings.Fields(string(b))[0], 64)
	return f
}

// tickTime is the uptime a ticker line ("tick 12345.67") was written at.
func tickTime(t *testing.T, line string) float64 {
	t.Helper()
	f, err := strconv.ParseFloat(strings.TrimPrefix(line, "tick "), 64)
	if err != nil {
		t.Fatalf("ticker line %q", line)
	}
	return f
}

// podLogFiles lists the files of a pod's logs (".log" in their name) under an agent's data dir.
func podLogFiles(dataDir, uid string) []string {
	var files []string
	_ = filepath.WalkDir(dataDir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.Contains(path, uid) && strings.Contains(d.Name(), ".log") {
			files = append(files, strings.TrimPrefix(path, dataDir+"/"))
		}
		return nil
	})
	return files
}

// topCPU checks that a row of kubectl top's output names the object and shows CPU above zero.
func topCPU(k kubectl, name string, args ...string) error {
	out, err := k.run(args...)
	if err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == name {
			cpu := f[1]
			v, err := strconv.ParseFloat(strings.TrimSuffix(cpu, "m"), 64)
			if err != nil || v <= 0 {
				return fmt.Errorf("CPU %q: %s", cpu, out)
			}
			return nil
		}
	}
	return fmt.Errorf("no row for %s: %s", name, out)
}

// getBody GETs url and returns the body of a 200 answer.
func getBody(client *http.Client, url string) ([]byte, error) {
	resp, err := client.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return body, err
}
