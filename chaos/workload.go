package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"

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
