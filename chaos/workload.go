package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
)

// The real workload of a round, beside the ConfigMap traffic: a Deployment scaled to a random size, whose pods
// the scheduler binds and the agents run through the faults, and a bare pod with a fixed name, the identity
// that must never run on two agents at once.
const (
	workloadNamespace = "chaos-workload"
	workloadDeploy    = "chaos-web"
	soloPod           = "chaos-solo"
	workloadImage     = "skiff.local/busybox:1"
)

// applyWorkload makes sure the workload exists and scales the Deployment to 1-4 replicas; it reports what it
// did. It needs the cluster's agents, so only runs on a cluster the suite controls.
func applyWorkload(ctx context.Context, kubeconfig string, rng *rand.Rand) (string, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return "", err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", err
	}
	if err := ensureNamespace(ctx, client, workloadNamespace); err != nil {
		return "", err
	}
	replicas := int32(1 + rng.IntN(4))
	labels := map[string]string{"app": workloadDeploy}
	container := corev1.Container{Name: "c", Image: workloadImage, Command: []string{"sleep", "3600"},
		ImagePullPolicy: corev1.PullIfNotPresent}
	deploy := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: workloadDeploy},
		Spec: appsv1.DeploymentSpec{Replicas: ptr.To(replicas), Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{container}, TerminationGracePeriodSeconds: ptr.To(int64(1))}}},
	}
	deployments := client.AppsV1().Deployments(workloadNamespace)
	if _, err := deployments.Create(ctx, deploy, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		scale, err := deployments.GetScale(ctx, workloadDeploy, metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		scale.Spec.Replicas = replicas
		if _, err := deployments.UpdateScale(ctx, workloadDeploy, scale, metav1.UpdateOptions{}); err != nil {
			return "", err
		}
	} else if err != nil {
		return "", err
	}
	solo := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: soloPod},
		Spec: corev1.PodSpec{Containers: []corev1.Container{container}, TerminationGracePeriodSeconds: ptr.To(int64(1))}}
	if _, err := client.CoreV1().Pods(workloadNamespace).Create(ctx, solo, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", err
	}
	return fmt.Sprintf("%s scaled to %d", workloadDeploy, replicas), nil
}

// Short pods: each round creates shortPods restartPolicy Never pods that print one line and end, with an
// envFrom Secret (the lookup that widened the window of issue 30's race). A pod must run exactly once, on
// the same agent as much as across agents: its log must hold its line once.
const (
	shortPods   = 12
	shortSecret = "chaos-once"
	shortLine   = "ran"
)

// ShortPods is a round's batch of short pods.
type ShortPods struct {
	client kubernetes.Interface
	names  []string
}

// StartShortPods creates the round's short pods (and the Secret they read).
func StartShortPods(ctx context.Context, kubeconfig string, round int) (*ShortPods, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	if err := ensureNamespace(ctx, client, workloadNamespace); err != nil {
		return nil, err
	}
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: shortSecret}, StringData: map[string]string{"LINE": shortLine}}
	if _, err := client.CoreV1().Secrets(workloadNamespace).Create(ctx, secret, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}
	sp := &ShortPods{client: client}
	for i := range shortPods {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("chaos-once-%d-%d", round, i), Labels: map[string]string{"chaos": "once"}},
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: ptr.To(int64(1)),
				Containers: []corev1.Container{{Name: "c", Image: workloadImage, ImagePullPolicy: corev1.PullIfNotPresent,
					Command: []string{"sh", "-c", "echo $LINE"},
					EnvFrom: []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: shortSecret}}}}}}}}
		if _, err := client.CoreV1().Pods(workloadNamespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return sp, err
		}
		sp.names = append(sp.names, pod.Name)
	}
	return sp, nil
}

// Check waits up to within for the pods to finish, then fails for each whose log holds its line more than
// once (it ran twice) or a line other than its own; it reports how many it could read. The pods are deleted.
// A pod still running, or whose agent cannot be reached, is not judged.
func (sp *ShortPods) Check(ctx context.Context, within time.Duration) (string, error) {
	pods := sp.client.CoreV1().Pods(workloadNamespace)
	defer func() {
		for _, name := range sp.names {
			_ = pods.Delete(context.WithoutCancel(ctx), name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))})
		}
	}()
	deadline := time.Now().Add(within)
	finished := map[string]bool{}
	for len(finished) < len(sp.names) && time.Now().Before(deadline) && ctx.Err() == nil {
		for _, name := range sp.names {
			if p, err := pods.Get(ctx, name, metav1.GetOptions{}); err == nil && (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed) {
				finished[name] = true
			}
		}
		sleep(ctx, time.Second)
	}
	var errs []error
	judged := 0
	for _, name := range sp.names {
		if !finished[name] {
			continue
		}
		raw, err := pods.GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			continue
		}
		judged++
		if lines := strings.Fields(string(raw)); len(lines) != 1 || lines[0] != shortLine {
			errs = append(errs, fmt.Errorf("pod %s ran more than once or not as asked: its log is %q", name, raw))
		}
	}
	return fmt.Sprintf("%d of %d short pods finished, %d logs read", len(finished), len(sp.names), judged), errors.Join(errs...)
}
