package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/internal/testimages"
)

// TestRealJobs runs Jobs and a CronJob on a real agent (containerd, runc, CNI) with the stock kubectl, as
// issue 18's acceptance asks: Kubernetes' Job, CronJob and TTL-after-finished controllers drive real pods.
// One server and one agent serve every part; the CronJob is created first and checked last, so that its
// minute ticks pass while the Jobs run.
func TestRealJobs(t *testing.T) {
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
	t.Cleanup(func() {
		if t.Failed() {
			for _, what := range [][]string{{"get", "jobs,cronjobs,pods", "-o", "wide"}, {"describe", "jobs"}, {"get", "events"}} {
				out, _ := k.run(what...)
				t.Logf("kubectl %s:\n%s", strings.Join(what, " "), out)
			}
		}
	})
	proctest.WaitFor(t, "the node Ready", 60*time.Second, func() error {
		if out, err := k.run("get", "node", agent.name, "--no-headers"); err != nil || !strings.Contains(out, " Ready ") {
			return fmt.Errorf("not yet: %s", out)
		}
		return nil
	})
	busybox := images.Busybox

	// A CronJob every minute whose Job outlasts the next minute: the first tick starts a Job, the second is
	// skipped (Forbid).
	created := time.Now()
	applyYAML(t, k, fmt.Sprintf(`apiVersion: batch/v1
kind: CronJob
metadata: {name: tick}
spec:
  schedule: "* * * * *"
  concurrencyPolicy: Forbid
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: Never
          terminationGracePeriodSeconds: 1
          containers:
          - {name: tick, image: %s, command: ["sleep", "150"]}
`, busybox))

	t.Run("kubectl create job", func(t *testing.T) {
		k := k.withT(t)
		k.ok("create", "job", "hello", "--image="+busybox, "--", "echo", "hello from a job")
		k.ok("wait", "--for=condition=complete", "job/hello", "--timeout=90s")
		header := strings.Fields(strings.SplitN(k.ok("get", "jobs", "hello"), "\n", 2)[0])
		if !slices.Equal(header, []string{"NAME", "STATUS", "COMPLETIONS", "DURATION", "AGE"}) {
			t.Fatalf("kubectl get jobs header %v", header)
		}
		if row := strings.Fields(k.ok("get", "job", "hello", "--no-headers")); row[1] != "Complete" || row[2] != "1/1" {
			t.Fatalf("kubectl get job hello: %v", row)
		}
		// The finished pod's log stays until the pod is deleted, as the kubelet keeps it; then it goes.
		if out := k.ok("logs", "job/hello"); !strings.Contains(out, "hello from a job") {
			t.Fatalf("kubectl logs job/hello: %q", out)
		}
		uid := k.ok("get", "pods", "-l", "job-name=hello", "-o", "jsonpath={.items[0].metadata.uid}")
		podDir := filepath.Join(agent.dataDir, "pods", uid)
		if _, err := os.Stat(filepath.Join(podDir, "logs")); err != nil {
			t.Fatalf("the finished pod's logs: %v", err)
		}
		k.ok("delete", "pods", "-l", "job-name=hello")
		proctest.WaitFor(t, "the deleted pod's directory removed", 30*time.Second, func() error {
			if _, err := os.Stat(podDir); !os.IsNotExist(err) {
				return fmt.Errorf("%s: %v", podDir, err)
			}
			return nil
		})
		// A run now from a (suspended) CronJob's template.
		k.ok("create", "cronjob", "later", "--image="+busybox, "--schedule=@yearly", "--", "true")
		k.ok("patch", "cronjob", "later", "-p", `{"spec":{"suspend":true}}`)
		k.ok("create", "job", "now", "--from=cronjob/later")
		k.ok("wait", "--for=condition=complete", "job/now", "--timeout=90s")
		if out := k.ok("get", "job", "now", "-o", "jsonpath={.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}"); out != "CronJob/later" {
			t.Fatalf("job now owned by %q; want CronJob/later", out)
		}
	})

	t.Run("completions 5 parallelism 2", func(t *testing.T) {
		k := k.withT(t)
		applyYAML(t, k, fmt.Sprintf(`apiVersion: batch/v1
kind: Job
metadata: {name: five}
spec:
  completions: 5
  parallelism: 2
  template:
    spec:
      restartPolicy: Never
      containers:
      - {name: work, image: %s, command: ["sh", "-c", "sleep 1"]}
`, busybox))
		k.ok("wait", "--for=condition=complete", "job/five", "--timeout=120s")
		if out := k.ok("get", "job", "five", "-o", "jsonpath={.status.succeeded}/{.status.failed}"); out != "5/" {
			t.Fatalf("succeeded/failed %s; want 5/", out)
		}
		if pods := strings.Fields(k.ok("get", "pods", "-l", "batch.kubernetes.io/job-name=five", "-o", "name")); len(pods) != 5 {
			t.Fatalf("%d pods, want 5: %v", len(pods), pods)
		}
	})

	t.Run("Indexed", func(t *testing.T) {
		k := k.withT(t)
		out := t.TempDir()
		applyYAML(t, k, fmt.Sprintf(`apiVersion: batch/v1
kind: Job
metadata: {name: indexed}
spec:
  completions: 3
  parallelism: 3
  completionMode: Indexed
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: work
        image: %s
        command: ["sh", "-c", "echo index=$JOB_COMPLETION_INDEX host=$(hostname) > /out/$JOB_COMPLETION_INDEX"]
        volumeMounts: [{name: out, mountPath: /out}]
      volumes:
      - name: out
        hostPath: {path: %s, type: DirectoryOrCreate}
`, busybox, out))
		k.ok("wait", "--for=condition=complete", "job/indexed", "--timeout=120s")
		// Each pod wrote what it saw to the host (the agent does not keep a finished pod's logs).
		for i := range 3 {
			data, err := os.ReadFile(filepath.Join(out, strconv.Itoa(i)))
			if want := fmt.Sprintf("index=%d host=indexed-%d", i, i); err != nil || strings.TrimSpace(string(data)) != want {
				t.Errorf("pod of index %d wrote %q, %v; want %q", i, data, err, want)
			}
		}
		if out := k.ok("get", "job", "indexed", "-o", "jsonpath={.status.completedIndexes}"); out != "0-2" {
			t.Fatalf("completedIndexes %q", out)
		}
	})

	t.Run("backoffLimit", func(t *testing.T) {
		k := k.withT(t)
		applyYAML(t, k, fmt.Sprintf(`apiVersion: batch/v1
kind: Job
metadata: {name: failing}
spec:
  backoffLimit: 1
  template:
    spec:
      restartPolicy: Never
      containers:
      - {name: work, image: %s, command: ["sh", "-c", "exit 1"]}
`, busybox))
		// One retry after Kubernetes' 10 s backoff, then the Job fails.
		k.ok("wait", "--for=condition=failed", "job/failing", "--timeout=120s")
		out := k.ok("get", "job", "failing", "-o", `jsonpath={.status.failed} {.status.conditions[?(@.type=="Failed")].reason}`)
		if out != "2 BackoffLimitExceeded" {
			t.Fatalf("failed and reason %q; want 2 BackoffLimitExceeded", out)
		}
		if row := strings.Fields(k.ok("get", "job", "failing", "--no-headers")); row[1] != "Failed" {
			t.Fatalf("kubectl get job failing: %v", row)
		}
	})

	t.Run("podFailurePolicy ignores exit code 42", func(t *testing.T) {
		k := k.withT(t)
		// The first pod exits 42 and leaves a mark on the host; its replacement sees the mark and succeeds.
		// With backoffLimit 0 a counted failure would fail the Job.
		applyYAML(t, k, fmt.Sprintf(`apiVersion: batch/v1
kind: Job
metadata: {name: flaky}
spec:
  backoffLimit: 0
  podFailurePolicy:
    rules:
    - action: Ignore
      onExitCodes: {operator: In, values: [42]}
  template:
    spec:
      restartPolicy: Never
      containers:
      - name: work
        image: %s
        command: ["sh", "-c", "if [ -e /mark/seen ]; then exit 0; fi; touch /mark/seen; exit 42"]
        volumeMounts: [{name: mark, mountPath: /mark}]
      volumes:
      - name: mark
        hostPath: {path: %s, type: DirectoryOrCreate}
`, busybox, t.TempDir()))
		k.ok("wait", "--for=condition=complete", "job/flaky", "--timeout=120s")
		if out := k.ok("get", "job", "flaky", "-o", "jsonpath={.status.succeeded}/{.status.failed}"); out != "1/" {
			t.Fatalf("succeeded/failed %s; want 1/ (the exit 42 not counted)", out)
		}
		if pods := strings.Fields(k.ok("get", "pods", "-l", "batch.kubernetes.io/job-name=flaky", "-o", "name")); len(pods) != 2 {
			t.Fatalf("%d pods, want the ignored one and its replacement: %v", len(pods), pods)
		}
	})

	t.Run("ttlSecondsAfterFinished", func(t *testing.T) {
		k := k.withT(t)
		applyYAML(t, k, fmt.Sprintf(`apiVersion: batch/v1
kind: Job
metadata: {name: ephemeral}
spec:
  ttlSecondsAfterFinished: 3
  template:
    spec:
      restartPolicy: Never
      containers:
      - {name: work, image: %s, command: ["true"]}
`, busybox))
		k.ok("wait", "--for=condition=complete", "job/ephemeral", "--timeout=90s")
		proctest.WaitFor(t, "the Job and its pod deleted", 60*time.Second, func() error {
			if out, err := k.run("get", "job", "ephemeral"); err == nil || !strings.Contains(out, "NotFound") {
				return fmt.Errorf("job: %s", out)
			}
			if out := k.ok("get", "pods", "-l", "batch.kubernetes.io/job-name=ephemeral", "-o", "name"); strings.Contains(out, "pod/") {
				return fmt.Errorf("pods left: %s", out)
			}
			return nil
		})
	})

	t.Run("CronJob", func(t *testing.T) {
		k := k.withT(t)
		// The first Job starts at the first minute after the CronJob was created; the next minute's run is
		// skipped while it is active.
		var first string
		proctest.WaitFor(t, "a Job from the CronJob", time.Until(created.Add(90*time.Second)), func() error {
			names := jobsOf(k, "tick")
			if len(names) != 1 {
				return fmt.Errorf("jobs of the CronJob: %v", names)
			}
			first = names[0]
			return nil
		})
		proctest.WaitFor(t, "its pod running", 60*time.Second, func() error {
			if out := k.ok("get", "pods", "-l", "batch.kubernetes.io/job-name="+first, "--no-headers"); !strings.Contains(out, "Running") {
				return fmt.Errorf("not yet: %s", out)
			}
			return nil
		})
		mustContain(t, "kubectl get cronjob", k.ok("get", "cronjob", "tick"), "SCHEDULE", "* * * * *", "False")
		proctest.WaitFor(t, "the next run skipped (Forbid)", time.Until(created.Add(150*time.Second)), func() error {
			out := k.ok("get", "events", "--field-selector", "involvedObject.kind=CronJob,involvedObject.name=tick,reason=JobAlreadyActive")
			if !strings.Contains(out, "JobAlreadyActive") {
				return fmt.Errorf("no JobAlreadyActive event yet")
			}
			return nil
		})
		if names := jobsOf(k, "tick"); len(names) != 1 {
			t.Fatalf("jobs of the CronJob %v; want only %s", names, first)
		}
		k.ok("delete", "cronjob", "tick", "--wait=true", "--timeout=60s")
	})
}

// jobsOf lists the Jobs whose owner is the named CronJob.
func jobsOf(k kubectl, cronJob string) []string {
	k.t.Helper()
	var names []string
	out := k.ok("get", "jobs", "--no-headers", "-o", "custom-columns=NAME:.metadata.name,KIND:.metadata.ownerReferences[0].kind,OWNER:.metadata.ownerReferences[0].name")
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[1] == "CronJob" && f[2] == cronJob {
			names = append(names, f[0])
		}
	}
	return names
}
