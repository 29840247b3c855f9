package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/internal/testimages"
)

// TestPodsRunOnce is issue 30's acceptance for "a pod must never run twice": 100 short restartPolicy Never
// pods with envFrom, created at once on one real agent, each run exactly once (its log holds one line and
// there is one attempt of its container); then 100 more with the agent killed -9 and started again while they
// run. It also runs a pod whose container name is 63 characters long.
func TestPodsRunOnce(t *testing.T) {
	parallelOnHostNetwork(t)
	requireRealRuntime(t)
	registry := testimages.StartRegistry(t)
	images := testimages.Push(t, registry)
	c := proctest.NewCluster(t, 1, fmt.Sprintf("token = %q", joinToken))
	c.Start(c.Procs[0])
	k := kubectl{t: t, kubeconfig: c.Procs[0].Kubeconfig()}
	k.waitForAPI("default")
	agent := newRealAgent(t, apiAddr(t, c.Procs[0].Kubeconfig()), registry)
	agent.start()
	proctest.WaitFor(t, "the node Ready", 60*time.Second, func() error {
		if out, err := k.run("get", "node", agent.name, "--no-headers"); err != nil || !strings.Contains(out, " Ready ") {
			return fmt.Errorf("not yet: %s", out)
		}
		return nil
	})
	k.ok("create", "secret", "generic", "greeting", "--from-literal=GREETING=run")

	const pods = 100
	manifest := func(batch string) string {
		var b strings.Builder
		for i := range pods {
			fmt.Fprintf(&b, `---
apiVersion: v1
kind: Pod
metadata: {name: %s-%03d, labels: {batch: %s}}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: once
    image: %s
    command: ["sh", "-c", "echo $GREETING"]
    envFrom: [{secretRef: {name: greeting}}]
`, batch, i, batch, images.Busybox)
		}
		return b.String()
	}
	succeeded := func(batch string) int {
		out, err := k.run("get", "pods", "-l", "batch="+batch, "-o", "jsonpath={range .items[*]}{.status.phase}{\"\\n\"}{end}")
		if err != nil {
			return -1
		}
		return strings.Count(out, "Succeeded")
	}
	// checkRanOnce reads what the agent kept of each pod: the log of each attempt of its container.
	checkRanOnce := func(t *testing.T, batch string) {
		out := k.ok("get", "pods", "-l", "batch="+batch, "-o", "jsonpath={range .items[*]}{.metadata.name} {.metadata.uid}{\"\\n\"}{end}")
		var bad []string
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			name, uid, _ := strings.Cut(line, " ")
			logs, _ := filepath.Glob(filepath.Join(agent.dataDir, "pods", uid, "logs", "once", "*.log"))
			var lines []string
			for _, f := range logs {
				data, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				lines = append(lines, strings.Split(strings.TrimSpace(string(data)), "\n")...)
			}
			if len(logs) != 1 || len(lines) != 1 || !strings.HasSuffix(lines[0], " run") {
				bad = append(bad, fmt.Sprintf("%s: %d attempt logs, lines %q", name, len(logs), lines))
			}
		}
		if len(bad) > 0 {
			t.Fatalf("%d pods did not run exactly once:\n%s", len(bad), strings.Join(bad, "\n"))
		}
	}
	// dump shows first what explains a pod that did not succeed: its description and the agent's log lines
	// about it (CI keeps only a part of a long output).
	dump := func(t *testing.T, batch string) {
		if !t.Failed() {
			return
		}
		out, _ := k.run("get", "pods", "-l", "batch="+batch, "-o", "jsonpath={range .items[*]}{.metadata.name} {.metadata.uid} {.status.phase}{\"\\n\"}{end}")
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			f := strings.Fields(line)
			if len(f) != 3 || f[2] == "Succeeded" {
				continue
			}
			desc, _ := k.run("describe", "pod", f[0])
			var logged []string
			for _, l := range strings.Split(agent.out.String(), "\n") {
				if strings.Contains(l, f[0]) || strings.Contains(l, f[1]) {
					logged = append(logged, l)
				}
			}
			if len(logged) > 60 {
				logged = append(logged[:30], logged[len(logged)-30:]...)
			}
			// The container's logs and its stdio process's own log.
			var files []string
			_ = filepath.WalkDir(filepath.Join(agent.dataDir, "pods", f[1]), func(path string, d os.DirEntry, err error) error {
				if err == nil && !d.IsDir() && (strings.HasSuffix(path, ".log") || strings.HasSuffix(path, ".json")) {
					data, _ := os.ReadFile(path)
					files = append(files, fmt.Sprintf("%s: %q", path, data))
				}
				return nil
			})
			t.Logf("pod %s (%s) is %s:\n%s\nthe agent's log about it:\n%s\nits files:\n%s", f[0], f[1], f[2], desc,
				strings.Join(logged, "\n"), strings.Join(files, "\n"))
		}
		out, _ = k.run("get", "events", "--field-selector", "type=Warning")
		t.Logf("warnings:\n%s", out)
		t.Logf("the agent's busy goroutines:\n%s", agent.goroutines())
	}

	t.Run("100 at once", func(t *testing.T) {
		k := k.withT(t)
		defer dump(t, "calm")
		applyYAML(t, k, manifest("calm"))
		proctest.WaitFor(t, "every pod Succeeded", 5*time.Minute, func() error {
			if n := succeeded("calm"); n != pods {
				return fmt.Errorf("%d of %d Succeeded", n, pods)
			}
			return nil
		})
		checkRanOnce(t, "calm")
	})

	t.Run("agent killed in the middle", func(t *testing.T) {
		k := k.withT(t)
		defer dump(t, "storm")
		applyYAML(t, k, manifest("storm"))
		proctest.WaitFor(t, "some pods Succeeded", 3*time.Minute, func() error {
			if n := succeeded("storm"); n < 10 {
				return fmt.Errorf("%d Succeeded", n)
			}
			return nil
		})
		agent.kill()
		t.Logf("agent killed with %d of %d pods Succeeded", succeeded("storm"), pods)
		agent.start()
		proctest.WaitFor(t, "every pod Succeeded", 5*time.Minute, func() error {
			if n := succeeded("storm"); n != pods {
				return fmt.Errorf("%d of %d Succeeded", n, pods)
			}
			return nil
		})
		checkRanOnce(t, "storm")
	})

	t.Run("63-character container name", func(t *testing.T) {
		k := k.withT(t)
		name := strings.Repeat("c", 62) + "x"
		applyYAML(t, k, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: long-name}
spec:
  restartPolicy: Never
  containers:
  - {name: %s, image: %s, command: ["echo", "long names run"]}
`, name, images.Busybox))
		proctest.WaitFor(t, "the pod Succeeded", 90*time.Second, func() error {
			if phase := k.ok("get", "pod", "long-name", "-o", "jsonpath={.status.phase}"); phase != "Succeeded" {
				return fmt.Errorf("phase %s", phase)
			}
			return nil
		})
		if out := k.ok("logs", "long-name"); !strings.Contains(out, "long names run") {
			t.Fatalf("kubectl logs long-name: %q", out)
		}
	})
}
