package apiserver_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/internal/servertest"
)

// TestServiceAccountTokenVolumeValidates: the kube-api-access volume the ServiceAccount admission
// (package apiserver/admission) adds to a new pod passes the pod's validation, with its name.
func TestServiceAccountTokenVolumeValidates(t *testing.T) {
	c := servertest.Start(t, 1)[0].Client
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "token"}, Spec: corev1.PodSpec{
		RestartPolicy: corev1.RestartPolicyAlways, Containers: []corev1.Container{{Name: "app", Image: "busybox"}}}}
	var got *corev1.Pod
	// The default account comes with the namespace, from the serviceaccount controller.
	proctest.WaitFor(t, "the pod created", 10*time.Second, func() error {
		var err error
		got, err = c.CoreV1().Pods("default").Create(context.Background(), pod, metav1.CreateOptions{})
		return err
	})
	for _, v := range got.Spec.Volumes {
		if strings.HasPrefix(v.Name, "kube-api-access-") && v.Projected != nil && len(got.Spec.Containers[0].VolumeMounts) == 1 {
			return
		}
	}
	t.Errorf("pod created without the token volume: volumes %+v, mounts %+v", got.Spec.Volumes, got.Spec.Containers[0].VolumeMounts)
}
