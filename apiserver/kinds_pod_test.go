package apiserver

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestPodServiceAccountNameImmutable: pod validation refuses a new serviceAccountName, as in Kubernetes; the
// ServiceAccount admission (package apiserver/admission) leaves updates alone and relies on it.
func TestPodServiceAccountNameImmutable(t *testing.T) {
	old := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "p", ResourceVersion: "1"}, Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "a", Image: "busybox"}}, ServiceAccountName: "default"}}
	pod := old.DeepCopy()
	pod.Spec.ServiceAccountName = "robot"
	if errs := validatePodUpdate(pod, old); len(errs) == 0 {
		t.Error("validatePodUpdate allows a new serviceAccountName")
	}
}
