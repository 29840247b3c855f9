package bench

import (
	"context"
	"flag"
	"fmt"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/internal/freeport"
	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/nodeagent"
)

var (
	jobCompletions  = flag.Int("workloads.job-completions", 1000, "completions of the Job in the workload benchmark")
	jobParallelism  = flag.Int("workloads.job-parallelism", 100, "parallelism of the Job in the workload benchmark")
	setReplicas     = flag.Int("workloads.statefulset-replicas", 100, "replicas of the Parallel StatefulSet in the workload benchmark")
	workloadSimNode = flag.Int("workloads.nodes", 20, "simulated nodes the workload benchmark's agent hosts")
)

// BenchmarkWorkloads measures Kubernetes' workload controllers running on Skiff's leader, on three `skiff
// server` processes and one simulated agent hosting -workloads.nodes nodes (pods start at once; a Job's pods
// exit 0 at once, through the simulated runtime's exit-code annotation):
//   - a Job of -workloads.job-completions completions at -workloads.job-parallelism: completions per second
//     from its creation to its Complete condition, and the leader's CPU over that time;
//   - a StatefulSet of -workloads.statefulset-replicas replicas, podManagementPolicy Parallel, created at
//     once: the time until every replica is Running and Ready (status.readyReplicas), and the leader's CPU.
//
// Run it with -benchtime=1x; the sizes are flags.
func BenchmarkWorkloads(b *testing.B) {
	c := proctest.NewCluster(b, 3, fmt.Sprintf("token = %q", benchJoinToken))
	for _, p := range c.Procs {
		c.Start(p)
	}
	client := clientFor(b, c.Procs[0].Kubeconfig())
	leader := c.ByName(c.HealthyPeers(c.Procs[0], 3))
	port := freeport.Take(b, []string{"127.0.0.1"}, 1)[0]
	startGossipSimAgent(b, "work", c.Procs[0].GossipAddr, c.Procs[0].Kubeconfig(), port, *workloadSimNode)
	ctx := context.Background()
	proctest.WaitFor(b, "the simulated nodes Ready", 120*time.Second, func() error {
		nodes, err := client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		ready := 0
		for _, n := range nodes.Items {
			for _, cond := range n.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		if ready < *workloadSimNode {
			return fmt.Errorf("%d of %d Ready", ready, *workloadSimNode)
		}
		return nil
	})
	proctest.WaitFor(b, "the default service account", 60*time.Second, func() error {
		_, err := client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err
	})
	b.ResetTimer()

	// The Job.
	completions, parallelism := int32(*jobCompletions), int32(*jobParallelism)
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "bench"}, Spec: batchv1.JobSpec{
		Completions: &completions, Parallelism: &parallelism,
		Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{nodeagent.SimulatedExitCodeAnnotation: "0"}},
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{Name: "work", Image: "registry.local/bench:1.0"}}}},
	}}
	cpu0 := leaderTicks(b, leader)
	start := time.Now()
	if _, err := client.BatchV1().Jobs("default").Create(ctx, job, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	waitUntil(b, "the Job Complete", 30*time.Minute, func() (bool, string) {
		j, err := client.BatchV1().Jobs("default").Get(ctx, "bench", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, cond := range j.Status.Conditions {
			if cond.Type == batchv1.JobComplete && cond.Status == corev1.ConditionTrue {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d succeeded", j.Status.Succeeded)
	})
	took := time.Since(start)
	leaderCPU := float64(leaderTicks(b, leader)-cpu0) / 100 / took.Seconds()
	b.ReportMetric(float64(completions)/took.Seconds(), "job-completions/s")
	b.ReportMetric(leaderCPU*100, "job-leader-cpu-%")
	b.Logf("Job of %d completions (parallelism %d) on %d simulated nodes: Complete after %v, %.1f completions/s; leader CPU %.0f%% of a core",
		completions, parallelism, *workloadSimNode, took.Round(time.Millisecond), float64(completions)/took.Seconds(), leaderCPU*100)

	// The StatefulSet.
	replicas := int32(*setReplicas)
	labels := map[string]string{"app": "bench-set"}
	set := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "bench"}, Spec: appsv1.StatefulSetSpec{
		Replicas: &replicas, ServiceName: "bench", PodManagementPolicy: appsv1.ParallelPodManagement,
		Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "work", Image: "registry.local/bench:1.0"}}}},
	}}
	cpu0 = leaderTicks(b, leader)
	start = time.Now()
	if _, err := client.AppsV1().StatefulSets("default").Create(ctx, set, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	waitUntil(b, "every replica Ready", 30*time.Minute, func() (bool, string) {
		s, err := client.AppsV1().StatefulSets("default").Get(ctx, "bench", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return s.Status.ReadyReplicas == replicas, fmt.Sprintf("%d ready", s.Status.ReadyReplicas)
	})
	took = time.Since(start)
	leaderCPU = float64(leaderTicks(b, leader)-cpu0) / 100 / took.Seconds()
	b.ReportMetric(took.Seconds(), "statefulset-all-ready-s")
	b.ReportMetric(leaderCPU*100, "statefulset-leader-cpu-%")
	b.Logf("StatefulSet of %d replicas (Parallel): all Ready after %v; leader CPU %.0f%% of a core",
		replicas, took.Round(time.Millisecond), leaderCPU*100)
	b.ReportMetric(0, "ns/op")
}

// leaderTicks is the leader process's CPU time so far, in clock ticks (1/100 s).
func leaderTicks(b *testing.B, leader *proctest.Proc) int64 {
	t, err := cpuTicks(leader.PID())
	if err != nil {
		b.Fatal(err)
	}
	return t
}

// waitUntil polls cond every 100 ms until it holds, failing the benchmark with cond's last word after timeout.
func waitUntil(b *testing.B, what string, timeout time.Duration, cond func() (bool, string)) {
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("waiting for %s: %s", what, state)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
