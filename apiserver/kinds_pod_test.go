package apiserver

import (
	"strings"
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

// TestPodSysctlValidation: kube-apiserver's sysctl checks, as the conformance test "should reject invalid
// sysctls" expects: malformed names are Invalid at spec.securityContext.sysctls[i].name, while well-formed
// ones pass whether or not a node allows them (kernel.shmmax, safe-and-unsafe: the node's admission decides).
func TestPodSysctlValidation(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "p"}, Spec: corev1.PodSpec{
		RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "a", Image: "busybox"}},
		SecurityContext: &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{
			{Name: "foo-", Value: "bar"}, {Name: "kernel.shmmax", Value: "100000000"},
			{Name: "safe-and-unsafe", Value: "100000000"}, {Name: "bar..", Value: "42"}, {Name: "kernel/shm_rmid_forced", Value: "1"},
		}}}}
	errs := validatePod(pod)
	if len(errs) != 2 || errs[0].Field != "spec.securityContext.sysctls[0].name" || errs[1].Field != "spec.securityContext.sysctls[3].name" {
		t.Fatalf("errors %v; want foo- and bar.. refused", errs)
	}
	for _, e := range errs {
		if !strings.Contains(e.Error(), `Invalid value: "foo-"`) && !strings.Contains(e.Error(), `Invalid value: "bar.."`) {
			t.Errorf("error %q", e.Error())
		}
	}
	pod.Spec.SecurityContext.Sysctls = []corev1.Sysctl{{Name: "net.ipv4.tcp_syncookies", Value: "1"}}
	pod.Spec.HostNetwork = true
	if errs := validatePod(pod); len(errs) != 1 || errs[0].Field != "spec.securityContext.sysctls[0].name" {
		t.Errorf("a net sysctl with hostNetwork: errors %v", errs)
	}
}

// TestPodUpdateTolerations: as kube-apiserver, an update may add tolerations before or after the old ones
// and change their tolerationSeconds, but not drop or change one otherwise.
func TestPodUpdateTolerations(t *testing.T) {
	secs := func(v int64) *int64 { return &v }
	notReady := corev1.Toleration{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: secs(300)}
	foo := corev1.Toleration{Key: "foo", Operator: corev1.TolerationOpEqual, Value: "bar", Effect: corev1.TaintEffectNoSchedule}
	old := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "p", ResourceVersion: "1"}, Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "a", Image: "busybox"}}, Tolerations: []corev1.Toleration{notReady}}}
	shorter := notReady
	shorter.TolerationSeconds = secs(10)
	changed := notReady
	changed.Effect = corev1.TaintEffectNoSchedule
	for _, tc := range []struct {
		name        string
		tolerations []corev1.Toleration
		ok          bool
	}{
		{"added after", []corev1.Toleration{notReady, foo}, true},
		{"added before", []corev1.Toleration{foo, notReady}, true},
		{"seconds changed", []corev1.Toleration{shorter}, true},
		{"removed", []corev1.Toleration{foo}, false},
		{"effect changed", []corev1.Toleration{changed}, false},
	} {
		pod := old.DeepCopy()
		pod.Spec.Tolerations = tc.tolerations
		if errs := validatePodUpdate(pod, old); (len(errs) == 0) != tc.ok {
			t.Errorf("%s: errors %v, want ok %v", tc.name, errs, tc.ok)
		}
	}
}
