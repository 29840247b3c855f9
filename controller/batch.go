package controller

import (
	"context"

	"k8s.io/kubernetes/pkg/controller/cronjob"
	"k8s.io/kubernetes/pkg/controller/job"
	"k8s.io/kubernetes/pkg/controller/ttlafterfinished"
)

// Kubernetes' own batch controllers, run as kube-controller-manager runs them, each with its default number
// of workers (--concurrent-job-syncs, --concurrent-cron-job-syncs, --concurrent-ttl-after-finished-syncs).
const (
	jobWorkers     = 5
	cronJobWorkers = 5
	ttlWorkers     = 5
)

// buildJobController builds Kubernetes' Job controller: pods from the template up to parallelism until
// completions succeed (NonIndexed, or Indexed with each pod's index in the batch.kubernetes.io/
// job-completion-index annotation, JOB_COMPLETION_INDEX and the hostname <job>-<index>), failed pods
// replaced after the exponential backoff (10 s doubling to 6 min) until backoffLimit or
// backoffLimitPerIndex, podFailurePolicy, successPolicy, activeDeadlineSeconds and suspend; the
// batch.kubernetes.io/job-tracking finalizer on each pod until the Job's status has counted it; status and
// the conditions Complete, Failed, SuccessCriteriaMet, FailureTarget and Suspended.
func buildJobController(ctx context.Context, c *Clients) (func(), error) {
	f := c.Informers
	// The Workload and PodGroup informers are for the alpha WorkloadWithJob feature, which is off.
	jc, err := job.NewController(ctx, c.Kube, f.Core().V1().Pods(), f.Batch().V1().Jobs(), nil, nil)
	if err != nil {
		return nil, err
	}
	return func() { jc.Run(ctx, jobWorkers) }, nil
}

// buildCronJobController builds Kubernetes' CronJob controller (v2): a Job from the template at each time of
// the schedule (cron syntax and its @hourly-style macros, in spec.timeZone or the server's zone), missed
// times started late within startingDeadlineSeconds, concurrencyPolicy Allow, Forbid (skip a run while one
// is active) or Replace, suspend, and the successful and failed history limits.
func buildCronJobController(ctx context.Context, c *Clients) (func(), error) {
	f := c.Informers
	cc, err := cronjob.NewControllerV2(ctx, f.Batch().V1().Jobs(), f.Batch().V1().CronJobs(), c.Kube)
	if err != nil {
		return nil, err
	}
	return func() { cc.Run(ctx, cronJobWorkers) }, nil
}

// buildTTLAfterFinishedController builds Kubernetes' TTL-after-finished controller: a finished Job (Complete or
// Failed) with spec.ttlSecondsAfterFinished is deleted that long after it finished, with foreground
// propagation, so its pods go first.
func buildTTLAfterFinishedController(ctx context.Context, c *Clients) (func(), error) {
	tc := ttlafterfinished.New(ctx, c.Informers.Batch().V1().Jobs(), c.Kube)
	return func() { tc.Run(ctx, ttlWorkers) }, nil
}
