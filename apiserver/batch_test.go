package apiserver_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	kptr "k8s.io/utils/ptr"

	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/internal/servertest"
)

func batchJob(name string, change func(*batchv1.Job)) *batchv1.Job {
	j := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: batchv1.JobSpec{
			// Suspended: the Job controller leaves it without pods, the API rules are what is tested here.
			Suspend: ptr(true),
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers:    []corev1.Container{{Name: "c", Image: "busybox"}},
			}},
		},
	}
	if change != nil {
		change(j)
	}
	return j
}

// invalidAt checks that err is a 422 Invalid naming field among its causes.
func invalidAt(t *testing.T, what string, err error, field string) {
	t.Helper()
	var status *apierrors.StatusError
	if !errors.As(err, &status) || !apierrors.IsInvalid(err) {
		t.Fatalf("%s: got %v, want 422 Invalid", what, err)
	}
	if status.ErrStatus.Code != 422 || status.ErrStatus.Details == nil {
		t.Fatalf("%s: status %+v", what, status.ErrStatus)
	}
	var fields []string
	for _, c := range status.ErrStatus.Details.Causes {
		fields = append(fields, c.Field)
	}
	if !slices.Contains(fields, field) {
		t.Fatalf("%s: causes name %v, want %s (%v)", what, fields, field, err)
	}
}

// Jobs get Kubernetes' defaults and generated selector, from kube's own batch/v1 defaulting and registry
// strategy: completions, parallelism, backoffLimit, completionMode, suspend, podReplacementPolicy,
// manualSelector, the controller-uid selector and template labels, the pod template's defaults; a status
// sent with the create is dropped.
func TestJobDefaults(t *testing.T) {
	t.Parallel()
	shared := servertest.Shared(t)
	c := shared.Client
	ns := servertest.Namespace(t, shared, "jobdefaults")
	ctx := context.Background()
	sent := batchJob("defaults", func(j *batchv1.Job) {
		j.Status.Succeeded = 5
		j.Spec.Suspend = nil
		j.Spec.Template.Spec.Containers[0].Image = "registry.invalid/never:1"
	})
	j, err := c.BatchV1().Jobs(ns).Create(ctx, sent, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s := j.Spec
	uid := string(j.UID)
	switch {
	case kptr.Deref(s.Completions, -1) != 1 || kptr.Deref(s.Parallelism, -1) != 1:
		t.Errorf("completions %v, parallelism %v; want 1 and 1", s.Completions, s.Parallelism)
	case kptr.Deref(s.BackoffLimit, -1) != 6:
		t.Errorf("backoffLimit %v; want 6", s.BackoffLimit)
	case kptr.Deref(s.CompletionMode, "") != batchv1.NonIndexedCompletion:
		t.Errorf("completionMode %v; want NonIndexed", s.CompletionMode)
	case kptr.Deref(s.PodReplacementPolicy, "") != batchv1.TerminatingOrFailed:
		t.Errorf("podReplacementPolicy %v; want TerminatingOrFailed", s.PodReplacementPolicy)
	case s.Suspend == nil || *s.Suspend || s.ManualSelector == nil || *s.ManualSelector:
		t.Errorf("suspend %v, manualSelector %v; want false and false", s.Suspend, s.ManualSelector)
	case s.Selector == nil || s.Selector.MatchLabels[batchv1.ControllerUidLabel] != uid:
		t.Errorf("selector %v; want %s=%s", s.Selector, batchv1.ControllerUidLabel, uid)
	case s.Template.Labels[batchv1.ControllerUidLabel] != uid || s.Template.Labels["controller-uid"] != uid ||
		s.Template.Labels[batchv1.JobNameLabel] != "defaults" || s.Template.Labels["job-name"] != "defaults":
		t.Errorf("template labels %v", s.Template.Labels)
	case s.Template.Spec.DNSPolicy != corev1.DNSClusterFirst || kptr.Deref(s.Template.Spec.TerminationGracePeriodSeconds, -1) != 30 ||
		s.Template.Spec.Containers[0].ImagePullPolicy != corev1.PullIfNotPresent || s.Template.Spec.Containers[0].TerminationMessagePath == "":
		t.Errorf("pod template not defaulted: %+v", s.Template.Spec)
	case j.Status.Succeeded != 0 || j.Generation != 1:
		t.Errorf("status %+v, generation %d; want an empty status and generation 1", j.Status, j.Generation)
	}

	// An Indexed Job with a pod failure policy: podReplacementPolicy Failed.
	j, err = c.BatchV1().Jobs(ns).Create(ctx, batchJob("indexed", func(j *batchv1.Job) {
		j.Spec.CompletionMode = ptr(batchv1.IndexedCompletion)
		j.Spec.Completions = ptr(int32(3))
		j.Spec.PodFailurePolicy = &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{{Action: batchv1.PodFailurePolicyActionIgnore,
			OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{Operator: batchv1.PodFailurePolicyOnExitCodesOpIn, Values: []int32{42}}}}}
	}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if kptr.Deref(j.Spec.PodReplacementPolicy, "") != batchv1.Failed || kptr.Deref(j.Spec.Parallelism, -1) != 1 {
		t.Errorf("podReplacementPolicy %v, parallelism %v; want Failed and 1", j.Spec.PodReplacementPolicy, j.Spec.Parallelism)
	}

	// CronJobs: concurrencyPolicy Allow, suspend false, history limits 3 and 1; the Job template defaulted.
	cj, err := c.BatchV1().CronJobs(ns).Create(ctx, &batchv1.CronJob{
		ObjectMeta: metav1.ObjectMeta{Name: "nightly"},
		Spec:       batchv1.CronJobSpec{Schedule: "@daily", JobTemplate: batchv1.JobTemplateSpec{Spec: batchJob("", nil).Spec}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cs := cj.Spec; cs.ConcurrencyPolicy != batchv1.AllowConcurrent || kptr.Deref(cs.Suspend, true) ||
		kptr.Deref(cs.SuccessfulJobsHistoryLimit, -1) != 3 || kptr.Deref(cs.FailedJobsHistoryLimit, -1) != 1 ||
		cs.JobTemplate.Spec.Template.Spec.DNSPolicy != corev1.DNSClusterFirst {
		t.Errorf("cronjob spec not defaulted: %+v", cs)
	}
}

var nfsVolume = []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{NFS: &corev1.NFSVolumeSource{Server: "nfs.example", Path: "/data"}}}}

// Kubernetes' Job and CronJob validation, with its field paths, in 422 answers; then Skiff's pod rules on
// the template.
func TestJobValidation(t *testing.T) {
	t.Parallel()
	shared := servertest.Shared(t)
	c := shared.Client
	ns := servertest.Namespace(t, shared, "jobvalid")
	ctx := context.Background()
	jobs := c.BatchV1().Jobs(ns)
	cases := []struct {
		name   string
		change func(*batchv1.Job)
		field  string
	}{
		{"pods that restart always", func(j *batchv1.Job) { j.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyAlways }, "spec.template.spec.restartPolicy"},
		{"negative parallelism", func(j *batchv1.Job) { j.Spec.Parallelism = ptr(int32(-1)) }, "spec.parallelism"},
		{"negative backoffLimit", func(j *batchv1.Job) { j.Spec.BackoffLimit = ptr(int32(-2)) }, "spec.backoffLimit"},
		{"Indexed without completions", func(j *batchv1.Job) {
			j.Spec.CompletionMode = ptr(batchv1.IndexedCompletion)
			j.Spec.Parallelism = ptr(int32(2))
		}, "spec.completions"},
		{"manual selector missing", func(j *batchv1.Job) { j.Spec.ManualSelector = ptr(true) }, "spec.selector"},
		{"manual selector not matching the template", func(j *batchv1.Job) {
			j.Spec.ManualSelector = ptr(true)
			j.Spec.Selector = &metav1.LabelSelector{MatchLabels: map[string]string{"a": "b"}}
			j.Spec.Template.Labels = map[string]string{"a": "c"}
		}, "spec.template.metadata.labels"},
		{"pod failure policy with OnFailure pods", func(j *batchv1.Job) {
			j.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyOnFailure
			j.Spec.PodFailurePolicy = &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{{Action: batchv1.PodFailurePolicyActionFailJob,
				OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{Operator: batchv1.PodFailurePolicyOnExitCodesOpIn, Values: []int32{1}}}}}
		}, "spec.template.spec.restartPolicy"},
		{"pod failure policy on exit code 0", func(j *batchv1.Job) {
			j.Spec.PodFailurePolicy = &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{{Action: batchv1.PodFailurePolicyActionFailJob,
				OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{Operator: batchv1.PodFailurePolicyOnExitCodesOpIn, Values: []int32{0}}}}}
		}, "spec.podFailurePolicy.rules[0].onExitCodes.values[0]"},
		{"negative ttlSecondsAfterFinished", func(j *batchv1.Job) { j.Spec.TTLSecondsAfterFinished = ptr(int32(-1)) }, "spec.ttlSecondsAfterFinished"},
		{"template without containers", func(j *batchv1.Job) { j.Spec.Template.Spec.Containers = nil }, "spec.template.spec.containers"},
		// Valid for Kubernetes, but Skiff's agents mount no NFS: refused with the Job rather than on each pod.
		{"a volume the agents do not mount", func(j *batchv1.Job) { j.Spec.Template.Spec.Volumes = nfsVolume }, "spec.template.spec.volumes[0]"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := jobs.Create(ctx, batchJob("bad", tc.change), metav1.CreateOptions{})
			invalidAt(t, tc.name, err, tc.field)
		})
	}

	// Updates: the pod template and the selector are immutable (the Job has not been suspended before it
	// started: it never was); completions only change with parallelism on Indexed Jobs.
	if _, err := jobs.Create(ctx, batchJob("fixed", func(j *batchv1.Job) { j.Spec.Suspend = nil }), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err := jobs.Patch(ctx, "fixed", types.StrategicMergePatchType, []byte(`{"spec":{"template":{"spec":{"containers":[{"name":"c","image":"other"}]}}}}`), metav1.PatchOptions{})
	invalidAt(t, "template change", err, "spec.template")
	_, err = jobs.Patch(ctx, "fixed", types.MergePatchType, []byte(`{"spec":{"completions":4}}`), metav1.PatchOptions{})
	invalidAt(t, "completions change", err, "spec.completions")

	crons := c.BatchV1().CronJobs(ns)
	cron := func(schedule string, tz *string) *batchv1.CronJob {
		return &batchv1.CronJob{ObjectMeta: metav1.ObjectMeta{Name: "cron"},
			Spec: batchv1.CronJobSpec{Schedule: schedule, TimeZone: tz, JobTemplate: batchv1.JobTemplateSpec{Spec: batchJob("", nil).Spec}}}
	}
	_, err = crons.Create(ctx, cron("every minute", nil), metav1.CreateOptions{})
	invalidAt(t, "bad schedule", err, "spec.schedule")
	_, err = crons.Create(ctx, cron("* * * * *", ptr("Mars/Olympus_Mons")), metav1.CreateOptions{})
	invalidAt(t, "bad time zone", err, "spec.timeZone")
	_, err = crons.Create(ctx, cron("TZ=UTC * * * * *", nil), metav1.CreateOptions{})
	invalidAt(t, "TZ in the schedule", err, "spec.schedule")
	nfs := cron("@hourly", nil)
	nfs.Spec.JobTemplate.Spec.Template.Spec.Volumes = nfsVolume
	_, err = crons.Create(ctx, nfs, metav1.CreateOptions{})
	invalidAt(t, "a volume the agents do not mount", err, "spec.jobTemplate.spec.template.spec.volumes[0]")

	// Privileged containers are allowed in templates as in pods (kube-apiserver --allow-privileged, as kubeadm
	// sets it): PodSecurity admission is where a namespace forbids them.
	privileged := batchJob("privileged", func(j *batchv1.Job) {
		j.Spec.Template.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr(true)}
	})
	if _, err := jobs.Create(ctx, privileged, metav1.CreateOptions{}); err != nil {
		t.Errorf("a Job of privileged pods: %v", err)
	}
}

// Job status follows kube's rules: a write to the resource keeps the old status; through /status the
// transitions are checked (Complete needs SuccessCriteriaMet, a start time and a completion time).
// `kubectl get jobs`' columns and the status.successful field selector are kube-apiserver's.
func TestJobStatusRules(t *testing.T) {
	t.Parallel()
	p := servertest.Shared(t)
	ns := servertest.Namespace(t, p, "jobstatus")
	c := p.Client
	ctx := context.Background()
	jobs := c.BatchV1().Jobs(ns)
	// A Job managed by another controller (spec.managedBy), so that Skiff's Job controller leaves its status
	// to this test.
	j, err := jobs.Create(ctx, batchJob("external", func(j *batchv1.Job) {
		j.Spec.Suspend = nil
		j.Spec.ManagedBy = ptr("example.com/test-controller")
	}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	j.Status.Succeeded = 1
	if j, err = jobs.Update(ctx, j, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	} else if j.Status.Succeeded != 0 {
		t.Fatalf("a write to the resource changed the status: %+v", j.Status)
	}
	now := metav1.Now()
	j.Status = batchv1.JobStatus{Succeeded: 1, StartTime: &now, CompletionTime: &now,
		Conditions: []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}}
	_, err = jobs.UpdateStatus(ctx, j, metav1.UpdateOptions{})
	invalidAt(t, "Complete without SuccessCriteriaMet", err, "status.conditions")
	j.Status.Conditions = append([]batchv1.JobCondition{{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue}}, j.Status.Conditions...)
	if j, err = jobs.UpdateStatus(ctx, j, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("a valid completion: %v", err)
	}

	// Field selector status.successful, as kube serves it; another field is refused.
	list, err := jobs.List(ctx, metav1.ListOptions{FieldSelector: "status.successful=1"})
	if err != nil || len(list.Items) != 1 || list.Items[0].Name != "external" {
		t.Fatalf("status.successful=1: %v, %v", list, err)
	}
	if _, err := jobs.List(ctx, metav1.ListOptions{FieldSelector: "status.active=1"}); !apierrors.IsBadRequest(err) {
		t.Fatalf("an unsupported field selector: %v, want 400", err)
	}

	// Table columns.
	table := &metav1.Table{}
	err = c.BatchV1().RESTClient().Get().Namespace(ns).Resource("jobs").Name("external").
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").Do(ctx).Into(table)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, col := range table.ColumnDefinitions {
		names = append(names, col.Name)
	}
	if strings.Join(names, ",") != "Name,Status,Completions,Duration,Age,Containers,Images,Selector" || len(table.Rows) != 1 {
		t.Fatalf("columns %v, rows %d", names, len(table.Rows))
	}
	if cells := table.Rows[0].Cells; cells[1] != "Complete" || cells[2] != "1/1" || cells[3] != "0s" {
		t.Fatalf("row %v; want Complete, 1/1, 0s", cells)
	}
	deleteOrphans(t, c, ns)
}

// deleteOrphans: deleting the batch/v1 Job "external" in ns without a propagation policy orphans its pods, as in Kubernetes
// (kube's strategy's default for batch/v1); with Background they go with it.
func deleteOrphans(t *testing.T, c kubernetes.Interface, ns string) {
	ctx := context.Background()
	j, err := c.BatchV1().Jobs(ns).Get(ctx, "external", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// A dependent the Job controller leaves alone (no controller reference, labels outside the selector):
	// one it controlled would be an active pod of a finished Job, which the controller deletes itself.
	pod, err := c.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "external-pod", OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "batch/v1", Kind: "Job", Name: j.Name, UID: j.UID}}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.BatchV1().Jobs(ns).Delete(ctx, j.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, "the job gone and its pod orphaned", 30*time.Second, func() error {
		if _, err := c.BatchV1().Jobs(ns).Get(ctx, j.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("job: %v", err)
		}
		p, err := c.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(p.OwnerReferences) > 0 {
			return fmt.Errorf("pod still owned: %v", p.OwnerReferences)
		}
		return nil
	})
}

// Server-side apply works on Jobs and CronJobs with kube's reset fields (a status in the applied
// configuration is ignored), and a second apply by another manager conflicts on the fields the first owns.
func TestJobServerSideApply(t *testing.T) {
	t.Parallel()
	shared := servertest.Shared(t)
	c := shared.Client
	ns := servertest.Namespace(t, shared, "jobapply")
	ctx := context.Background()
	cron := []byte(`{"apiVersion":"batch/v1","kind":"CronJob","metadata":{"name":"ssa"},"spec":{"schedule":"@hourly",
		"jobTemplate":{"spec":{"template":{"spec":{"restartPolicy":"Never","containers":[{"name":"c","image":"busybox"}]}}}}},
		"status":{"active":[{"name":"x"}]}}`)
	cj, err := c.BatchV1().CronJobs(ns).Patch(ctx, "ssa", types.ApplyPatchType, cron, metav1.PatchOptions{FieldManager: "first"})
	if err != nil {
		t.Fatal(err)
	}
	if len(cj.Status.Active) != 0 || cj.Spec.ConcurrencyPolicy != batchv1.AllowConcurrent {
		t.Fatalf("applied cronjob: status %+v, concurrencyPolicy %q", cj.Status, cj.Spec.ConcurrencyPolicy)
	}
	job := []byte(`{"apiVersion":"batch/v1","kind":"Job","metadata":{"name":"ssa"},"spec":{"suspend":true,"parallelism":2,
		"template":{"spec":{"restartPolicy":"Never","containers":[{"name":"c","image":"busybox"}]}}}}`)
	if _, err := c.BatchV1().Jobs(ns).Patch(ctx, "ssa", types.ApplyPatchType, job, metav1.PatchOptions{FieldManager: "first"}); err != nil {
		t.Fatal(err)
	}
	other := []byte(`{"apiVersion":"batch/v1","kind":"Job","metadata":{"name":"ssa"},"spec":{"parallelism":3}}`)
	if _, err := c.BatchV1().Jobs(ns).Patch(ctx, "ssa", types.ApplyPatchType, other, metav1.PatchOptions{FieldManager: "second"}); !apierrors.IsConflict(err) {
		t.Fatalf("a second manager changing parallelism: %v, want 409 Conflict", err)
	}
	// An update that carries no managed fields, as a controller's does from a cache that drops them
	// (internal/cachetransform), keeps the stored ones: the applier still owns what it applied.
	// The Job controller writes the suspended job's status meanwhile: a conflict is retried, as a controller retries it.
	var updated *batchv1.Job
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		stored, err := c.BatchV1().Jobs(ns).Get(ctx, "ssa", metav1.GetOptions{})
		if err != nil {
			return err
		}
		stored.ManagedFields = nil
		stored.Spec.Parallelism = kptr.To[int32](4)
		updated, err = c.BatchV1().Jobs(ns).Update(ctx, stored, metav1.UpdateOptions{FieldManager: "controller"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	managers := map[string]metav1.ManagedFieldsOperationType{}
	for _, m := range updated.ManagedFields {
		managers[m.Manager] = m.Operation
	}
	if managers["first"] != metav1.ManagedFieldsOperationApply || managers["controller"] != metav1.ManagedFieldsOperationUpdate {
		t.Errorf("managed fields after an update without them: %v; want first's apply kept and controller's update", managers)
	}
}
