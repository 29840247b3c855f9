package controller_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	kptr "k8s.io/utils/ptr"

	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/internal/servertest"
)

// newJob is a Job of pods that restart never, changed by change.
func newJob(name string, change func(*batchv1.Job)) *batchv1.Job {
	j := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers:    []corev1.Container{{Name: "work", Image: "busybox"}},
		}}},
	}
	if change != nil {
		change(j)
	}
	return j
}

// jobPods are the Job's pods that have not ended yet (Pending or Running), and all of its pods, by name.
func jobPods(t *testing.T, c kubernetes.Interface, ns string, j *batchv1.Job) (active, all []corev1.Pod) {
	t.Helper()
	list, err := c.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{
		LabelSelector: batchv1.ControllerUidLabel + "=" + string(j.UID)})
	if err != nil {
		t.Fatal(err)
	}
	sort.Slice(list.Items, func(a, b int) bool { return list.Items[a].Name < list.Items[b].Name })
	for _, p := range list.Items {
		if p.DeletionTimestamp == nil && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			active = append(active, p)
		}
	}
	return active, list.Items
}

// waitForActive waits until the Job has exactly n pods that have not ended, and returns them.
func waitForActive(t *testing.T, c kubernetes.Interface, ns string, j *batchv1.Job, n int) []corev1.Pod {
	t.Helper()
	var active []corev1.Pod
	proctest.WaitFor(t, fmt.Sprintf("%d active pods of %s", n, j.Name), 30*time.Second, func() error {
		active, _ = jobPods(t, c, ns, j)
		if len(active) != n {
			return fmt.Errorf("%d active: %v", len(active), podNames(active))
		}
		return nil
	})
	return active
}

// endPod does what a node agent does when the pod's container exits: the pod ends Succeeded (exit 0) or
// Failed, with the container's exit code.
func endPod(t *testing.T, c kubernetes.Interface, ns, name string, exitCode int32) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		pod, err := c.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		pod.Status.Phase = corev1.PodSucceeded
		reason := "Completed"
		if exitCode != 0 {
			pod.Status.Phase, reason = corev1.PodFailed, "Error"
		}
		pod.Status.StartTime = &now
		pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "work", Image: "busybox", State: corev1.ContainerState{
			Terminated: &corev1.ContainerStateTerminated{ExitCode: exitCode, Reason: reason, StartedAt: now, FinishedAt: now}}}}
		_, err = c.CoreV1().Pods(ns).UpdateStatus(context.Background(), pod, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// waitForCondition waits until the Job has this condition true, and returns the Job.
func waitForCondition(t *testing.T, c kubernetes.Interface, ns, name string, cond batchv1.JobConditionType) *batchv1.Job {
	t.Helper()
	var j *batchv1.Job
	proctest.WaitFor(t, fmt.Sprintf("%s %s", name, cond), 30*time.Second, func() error {
		var err error
		if j, err = c.BatchV1().Jobs(ns).Get(context.Background(), name, metav1.GetOptions{}); err != nil {
			return err
		}
		for _, jc := range j.Status.Conditions {
			if jc.Type == cond && jc.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("status %+v", j.Status)
	})
	return j
}

func createJob(t *testing.T, c kubernetes.Interface, ns string, j *batchv1.Job) *batchv1.Job {
	t.Helper()
	created, err := c.BatchV1().Jobs(ns).Create(context.Background(), j, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return created
}

// TestJobController runs Kubernetes' Job, CronJob and TTL-after-finished controllers on a real server, with
// the test doing the node agent's part (ending pods with an exit code).
func TestJobController(t *testing.T) {
	t.Parallel()
	p := servertest.Shared(t)
	c := p.Client
	ns := servertest.Namespace(t, p, "job")
	ctx := context.Background()

	// The subtests run at once, each with its own Job: the CronJob's waits for the next minute.
	t.Run("completions and parallelism", func(t *testing.T) {
		t.Parallel()
		j := createJob(t, c, ns, newJob("five", func(j *batchv1.Job) {
			j.Spec.Completions, j.Spec.Parallelism = kptr.To[int32](5), kptr.To[int32](2)
		}))
		for done := 0; done < 5; done++ {
			// Never more than parallelism at once, and no more than the completions still missing.
			active := waitForActive(t, c, ns, j, min(2, 5-done))
			for _, p := range active {
				if !slices.Contains(p.Finalizers, batchv1.JobTrackingFinalizer) {
					t.Fatalf("pod %s has no %s finalizer: %v", p.Name, batchv1.JobTrackingFinalizer, p.Finalizers)
				}
			}
			endPod(t, c, ns, active[0].Name, 0)
		}
		j = waitForCondition(t, c, ns, "five", batchv1.JobComplete)
		if j.Status.Succeeded != 5 || j.Status.Failed != 0 || j.Status.CompletionTime == nil {
			t.Fatalf("status %+v; want 5 succeeded", j.Status)
		}
		proctest.WaitFor(t, "the tracking finalizers removed", 30*time.Second, func() error {
			_, all := jobPods(t, c, ns, j)
			for _, p := range all {
				if len(p.Finalizers) > 0 {
					return fmt.Errorf("%s has %v", p.Name, p.Finalizers)
				}
			}
			if len(all) != 5 {
				return fmt.Errorf("%d pods", len(all))
			}
			return nil
		})
	})

	t.Run("indexed", func(t *testing.T) {
		t.Parallel()
		j := createJob(t, c, ns, newJob("indexed", func(j *batchv1.Job) {
			j.Spec.Completions, j.Spec.Parallelism = kptr.To[int32](3), kptr.To[int32](3)
			j.Spec.CompletionMode = kptr.To(batchv1.IndexedCompletion)
		}))
		active := waitForActive(t, c, ns, j, 3)
		var indexes []string
		for _, p := range active {
			index := p.Annotations[batchv1.JobCompletionIndexAnnotation]
			indexes = append(indexes, index)
			if p.Spec.Hostname != "indexed-"+index || p.Labels[batchv1.JobCompletionIndexAnnotation] != index {
				t.Errorf("pod %s of index %s: hostname %q, labels %v", p.Name, index, p.Spec.Hostname, p.Labels)
			}
			env := p.Spec.Containers[0].Env
			if i := slices.IndexFunc(env, func(e corev1.EnvVar) bool { return e.Name == "JOB_COMPLETION_INDEX" }); i < 0 ||
				env[i].ValueFrom == nil || env[i].ValueFrom.FieldRef == nil ||
				env[i].ValueFrom.FieldRef.FieldPath != "metadata.labels['"+batchv1.JobCompletionIndexAnnotation+"']" {
				t.Errorf("pod %s: env %+v", p.Name, env)
			}
			endPod(t, c, ns, p.Name, 0)
		}
		slices.Sort(indexes)
		if !slices.Equal(indexes, []string{"0", "1", "2"}) {
			t.Fatalf("indexes %v", indexes)
		}
		if j = waitForCondition(t, c, ns, "indexed", batchv1.JobComplete); j.Status.CompletedIndexes != "0-2" {
			t.Fatalf("completedIndexes %q", j.Status.CompletedIndexes)
		}
	})

	t.Run("backoffLimit", func(t *testing.T) {
		t.Parallel()
		j := createJob(t, c, ns, newJob("fails", func(j *batchv1.Job) { j.Spec.BackoffLimit = kptr.To[int32](0) }))
		endPod(t, c, ns, waitForActive(t, c, ns, j, 1)[0].Name, 1)
		j = waitForCondition(t, c, ns, "fails", batchv1.JobFailed)
		if j.Status.Failed != 1 || !hasReason(j, batchv1.JobFailed, batchv1.JobReasonBackoffLimitExceeded) {
			t.Fatalf("status %+v; want 1 failed, BackoffLimitExceeded", j.Status)
		}
	})

	t.Run("podFailurePolicy", func(t *testing.T) {
		t.Parallel()
		// Exit code 42 is ignored: the pod is replaced without counting against backoffLimit 0. Exit code
		// 3 fails the Job at once.
		policy := func(j *batchv1.Job) {
			j.Spec.BackoffLimit = kptr.To[int32](0)
			j.Spec.PodFailurePolicy = &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{
				{Action: batchv1.PodFailurePolicyActionIgnore, OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{
					Operator: batchv1.PodFailurePolicyOnExitCodesOpIn, Values: []int32{42}}},
				{Action: batchv1.PodFailurePolicyActionFailJob, OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{
					Operator: batchv1.PodFailurePolicyOnExitCodesOpIn, Values: []int32{3}}},
			}}
		}
		j := createJob(t, c, ns, newJob("ignore42", policy))
		first := waitForActive(t, c, ns, j, 1)[0]
		endPod(t, c, ns, first.Name, 42)
		var second corev1.Pod
		proctest.WaitFor(t, "a replacement pod", 30*time.Second, func() error {
			active, _ := jobPods(t, c, ns, j)
			if len(active) != 1 || active[0].Name == first.Name {
				return fmt.Errorf("active %v", podNames(active))
			}
			second = active[0]
			return nil
		})
		endPod(t, c, ns, second.Name, 0)
		if j = waitForCondition(t, c, ns, "ignore42", batchv1.JobComplete); j.Status.Failed != 0 || j.Status.Succeeded != 1 {
			t.Fatalf("status %+v; want the ignored failure not counted", j.Status)
		}

		j = createJob(t, c, ns, newJob("exit3", policy))
		endPod(t, c, ns, waitForActive(t, c, ns, j, 1)[0].Name, 3)
		if j = waitForCondition(t, c, ns, "exit3", batchv1.JobFailed); !hasReason(j, batchv1.JobFailed, batchv1.JobReasonPodFailurePolicy) {
			t.Fatalf("status %+v; want PodFailurePolicy", j.Status)
		}
	})

	t.Run("ttlSecondsAfterFinished", func(t *testing.T) {
		t.Parallel()
		j := createJob(t, c, ns, newJob("short-lived", func(j *batchv1.Job) { j.Spec.TTLSecondsAfterFinished = kptr.To[int32](0) }))
		pod := waitForActive(t, c, ns, j, 1)[0]
		endPod(t, c, ns, pod.Name, 0)
		// The TTL controller deletes the Job in the foreground, so the garbage collector's next rounds remove
		// the pod and then the Job: a minute, for a loaded machine.
		proctest.WaitFor(t, "the finished Job and its pod deleted", time.Minute, func() error {
			if _, err := c.BatchV1().Jobs(ns).Get(ctx, j.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("job: %v", err)
			}
			if _, err := c.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("pod: %v", err)
			}
			return nil
		})
	})

	t.Run("cronjob", func(t *testing.T) {
		t.Parallel()
		// The controller starts the most recent missed time at once (no startingDeadlineSeconds): a last
		// schedule three minutes back stands for a CronJob whose time has come, without waiting for the
		// next minute.
		cj, err := c.BatchV1().CronJobs(ns).Create(ctx, &batchv1.CronJob{
			ObjectMeta: metav1.ObjectMeta{Name: "minutely"},
			Spec: batchv1.CronJobSpec{Schedule: "* * * * *", ConcurrencyPolicy: batchv1.ForbidConcurrent,
				JobTemplate: batchv1.JobTemplateSpec{Spec: newJob("", nil).Spec}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// Backdated once: the controller starts a Job at once.
		err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur, err := c.BatchV1().CronJobs(ns).Get(ctx, cj.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			cur.Status.LastScheduleTime = kptr.To(metav1.NewTime(time.Now().Add(-3 * time.Minute).Truncate(time.Minute)))
			_, err = c.BatchV1().CronJobs(ns).UpdateStatus(ctx, cur, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		var first batchv1.Job
		proctest.WaitFor(t, "a Job of the CronJob", 30*time.Second, func() error {
			jobs, err := c.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return err
			}
			var owned []string
			for _, j := range jobs.Items {
				if ref := metav1.GetControllerOf(&j); ref != nil && ref.UID == cj.UID {
					owned, first = append(owned, j.Name), j
				}
			}
			if len(owned) != 1 {
				return fmt.Errorf("jobs of the cronjob: %v", owned)
			}
			return nil
		})
		proctest.WaitFor(t, "the Job active in the CronJob's status", 30*time.Second, func() error {
			cur, err := c.BatchV1().CronJobs(ns).Get(ctx, cj.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if len(cur.Status.Active) != 1 || cur.Status.Active[0].Name != first.Name || cur.Status.LastScheduleTime == nil {
				return fmt.Errorf("status %+v", cur.Status)
			}
			return nil
		})
		// The Job still runs: with Forbid, the next time of the schedule (within a minute) is skipped.
		waitForEventOn(t, c, ns, "CronJob", cj.Name, "JobAlreadyActive", 90*time.Second)
		jobs, err := c.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(slices.DeleteFunc(jobs.Items, func(j batchv1.Job) bool { return !metav1.IsControlledBy(&j, cj) })) != 1 {
			t.Fatalf("a second Job started while the first ran, despite Forbid")
		}
	})
}

func hasReason(j *batchv1.Job, cond batchv1.JobConditionType, reason string) bool {
	return slices.ContainsFunc(j.Status.Conditions, func(c batchv1.JobCondition) bool {
		return c.Type == cond && c.Status == corev1.ConditionTrue && c.Reason == reason
	})
}

// waitForEventOn waits for an event with this reason on the named object of this kind.
func waitForEventOn(t *testing.T, c kubernetes.Interface, ns, kind, name, reason string, timeout time.Duration) {
	t.Helper()
	proctest.WaitFor(t, fmt.Sprintf("a %s event on %s %s", reason, kind, name), timeout, func() error {
		list, err := c.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{
			FieldSelector: "involvedObject.kind=" + kind + ",involvedObject.name=" + name + ",reason=" + reason})
		if err != nil {
			return err
		}
		if len(list.Items) == 0 {
			return fmt.Errorf("none yet")
		}
		return nil
	})
}
