package apiserver

import (
	"fmt"
	"strconv"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/duration"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/kubernetes/pkg/apis/batch"
	kubebatchv1 "k8s.io/kubernetes/pkg/apis/batch/v1"
	"k8s.io/kubernetes/pkg/apis/core"
	cronjobregistry "k8s.io/kubernetes/pkg/registry/batch/cronjob"
	jobregistry "k8s.io/kubernetes/pkg/registry/batch/job"
)

// Jobs and CronJobs (batch/v1) follow Kubernetes' own contract: kube's batch/v1 defaults (completions and
// parallelism 1, backoffLimit 6, completionMode NonIndexed, suspend false, podReplacementPolicy, the
// CronJob's concurrencyPolicy Allow and history limits 3 and 1, the pod template's defaults), kube's
// registry strategies (a Job's generated selector on batch.kubernetes.io/controller-uid and the template
// labels it matches unless spec.manualSelector, status only through /status with kube's status-transition
// rules, generation bumped on spec changes) and validation with field paths, run on kube's internal types
// through the converting adapter (kubestrategy.go). The pod template must also pass Skiff's pod rules.
// Kube's Job, CronJob and TTL-after-finished controllers run them (controller/batch.go).

func init() {
	// kube's internal batch types, the v1 ones, and kube's conversions and v1 defaults between them.
	utilruntime.Must(batch.AddToScheme(kubeScheme))
	utilruntime.Must(kubebatchv1.AddToScheme(kubeScheme))
}

// jobStrategies are kube's Job strategies: the resource and /status (the Job controller's counts and
// conditions).
var jobStrategies = &kubeStrategies{
	internal: func() runtime.Object { return &batch.Job{} },
	main: templateLimited{jobregistry.Strategy, func(obj runtime.Object) (*core.PodTemplateSpec, string) {
		return &obj.(*batch.Job).Spec.Template, "spec.template"
	}},
	subresources: map[string]kubeStrategy{"status": jobregistry.StatusStrategy},
}

// cronJobStrategies are kube's CronJob strategies: the resource and /status (active Jobs, last schedule and
// last success).
var cronJobStrategies = &kubeStrategies{
	internal: func() runtime.Object { return &batch.CronJob{} },
	main: templateLimited{cronjobregistry.Strategy, func(obj runtime.Object) (*core.PodTemplateSpec, string) {
		return &obj.(*batch.CronJob).Spec.JobTemplate.Spec.Template, "spec.jobTemplate.spec.template"
	}},
	subresources: map[string]kubeStrategy{"status": cronjobregistry.StatusStrategy},
}

// jobFields are the field selectors kube serves for Jobs beyond metadata.name and metadata.namespace.
func jobFields(obj runtime.Object) fields.Set {
	return fields.Set{"status.successful": strconv.Itoa(int(obj.(*batchv1.Job).Status.Succeeded))}
}

// jobColumns are `kubectl get jobs`' columns, as kube-apiserver prints them.
var jobColumns = []column{
	nameColumn,
	{name: "Status", typ: "string", value: func(o runtime.Object) any { return jobStatus(o.(*batchv1.Job)) }},
	{name: "Completions", typ: "string", value: func(o runtime.Object) any { return jobCompletions(o.(*batchv1.Job)) }},
	{name: "Duration", typ: "string", value: func(o runtime.Object) any { return jobDuration(o.(*batchv1.Job)) }},
	ageColumn,
	{name: "Containers", typ: "string", priority: 1, value: func(o runtime.Object) any {
		return containerNames(o.(*batchv1.Job).Spec.Template.Spec.Containers)
	}},
	{name: "Images", typ: "string", priority: 1, value: func(o runtime.Object) any {
		return containerImages(o.(*batchv1.Job).Spec.Template.Spec.Containers)
	}},
	{name: "Selector", typ: "string", priority: 1, value: func(o runtime.Object) any {
		return metav1.FormatLabelSelector(o.(*batchv1.Job).Spec.Selector)
	}},
}

// cronJobColumns are `kubectl get cronjobs`' columns, as kube-apiserver prints them.
var cronJobColumns = []column{
	nameColumn,
	{name: "Schedule", typ: "string", value: func(o runtime.Object) any { return o.(*batchv1.CronJob).Spec.Schedule }},
	{name: "Timezone", typ: "string", value: func(o runtime.Object) any {
		if tz := o.(*batchv1.CronJob).Spec.TimeZone; tz != nil {
			return *tz
		}
		return "<none>"
	}},
	{name: "Suspend", typ: "boolean", value: func(o runtime.Object) any {
		switch s := o.(*batchv1.CronJob).Spec.Suspend; {
		case s == nil:
			return "<unset>"
		case *s:
			return "True"
		}
		return "False"
	}},
	{name: "Active", typ: "integer", value: func(o runtime.Object) any { return int64(len(o.(*batchv1.CronJob).Status.Active)) }},
	{name: "Last Schedule", typ: "string", value: func(o runtime.Object) any {
		if t := o.(*batchv1.CronJob).Status.LastScheduleTime; t != nil {
			return age(*t)
		}
		return "<none>"
	}},
	ageColumn,
	{name: "Containers", typ: "string", priority: 1, value: func(o runtime.Object) any {
		return containerNames(o.(*batchv1.CronJob).Spec.JobTemplate.Spec.Template.Spec.Containers)
	}},
	{name: "Images", typ: "string", priority: 1, value: func(o runtime.Object) any {
		return containerImages(o.(*batchv1.CronJob).Spec.JobTemplate.Spec.Template.Spec.Containers)
	}},
	{name: "Selector", typ: "string", priority: 1, value: func(o runtime.Object) any {
		return metav1.FormatLabelSelector(o.(*batchv1.CronJob).Spec.JobTemplate.Spec.Selector)
	}},
}

// jobStatus is the STATUS column: the first of Complete, Failed, Terminating, Suspended, FailureTarget and
// SuccessCriteriaMet that holds, else Running.
func jobStatus(j *batchv1.Job) string {
	switch {
	case jobCondition(j, batchv1.JobComplete):
		return "Complete"
	case jobCondition(j, batchv1.JobFailed):
		return "Failed"
	case j.DeletionTimestamp != nil:
		return "Terminating"
	case jobCondition(j, batchv1.JobSuspended):
		return "Suspended"
	case jobCondition(j, batchv1.JobFailureTarget):
		return "FailureTarget"
	case jobCondition(j, batchv1.JobSuccessCriteriaMet):
		return "SuccessCriteriaMet"
	}
	return "Running"
}

// jobCondition reports whether the first condition of this type is true, as kube's printer reads it.
func jobCondition(j *batchv1.Job, t batchv1.JobConditionType) bool {
	for _, c := range j.Status.Conditions {
		if c.Type == t {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// jobCompletions is the COMPLETIONS column: succeeded/completions, or for a work queue (no completions)
// succeeded/1, "of <parallelism>" when more than one pod runs at a time.
func jobCompletions(j *batchv1.Job) string {
	if j.Spec.Completions != nil {
		return fmt.Sprintf("%d/%d", j.Status.Succeeded, *j.Spec.Completions)
	}
	if p := j.Spec.Parallelism; p != nil && *p > 1 {
		return fmt.Sprintf("%d/1 of %d", j.Status.Succeeded, *p)
	}
	return fmt.Sprintf("%d/1", j.Status.Succeeded)
}

// jobDuration is the DURATION column: from the start to completion, or to now while the Job runs.
func jobDuration(j *batchv1.Job) string {
	switch {
	case j.Status.StartTime == nil:
		return ""
	case j.Status.CompletionTime == nil:
		return age(*j.Status.StartTime)
	}
	return duration.HumanDuration(j.Status.CompletionTime.Sub(j.Status.StartTime.Time))
}
