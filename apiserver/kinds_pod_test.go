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

// TestPodGRPCProbeValidation: grpc probes are accepted (the agent runs them); a port outside 1-65535 and an
// unknown mode are refused with kube-apiserver's field paths.
func TestPodGRPCProbeValidation(t *testing.T) {
	pod := func(g *corev1.GRPCAction) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "p"}, Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyAlways,
			Containers: []corev1.Container{{Name: "a", Image: "busybox",
				LivenessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{GRPC: g}}}}}}
	}
	tlsMode, badMode := corev1.GRPCProbeModeTLS, corev1.GRPCProbeMode("SSL")
	if errs := validatePod(pod(&corev1.GRPCAction{Port: 5000})); len(errs) != 0 {
		t.Errorf("a grpc probe is refused: %v", errs)
	}
	if errs := validatePod(pod(&corev1.GRPCAction{Port: 5000, Mode: &tlsMode})); len(errs) != 0 {
		t.Errorf("a TLS grpc probe is refused: %v", errs)
	}
	for _, tc := range []struct {
		g     *corev1.GRPCAction
		field string
	}{
		{&corev1.GRPCAction{Port: 0}, "spec.containers[0].livenessProbe.grpc.port"},
		{&corev1.GRPCAction{Port: 70000}, "spec.containers[0].livenessProbe.grpc.port"},
		{&corev1.GRPCAction{Port: 5000, Mode: &badMode}, "spec.containers[0].livenessProbe.grpc.mode"},
	} {
		errs := validatePod(pod(tc.g))
		if len(errs) != 1 || errs[0].Field != tc.field {
			t.Errorf("%+v: errors %v, want one on %s", tc.g, errs, tc.field)
		}
	}
}
