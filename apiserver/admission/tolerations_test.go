package admission

import (
	"context"
	"fmt"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/admission"
)

const (
	tolNotReady    = "node.kubernetes.io/not-ready"
	tolUnreachable = "node.kubernetes.io/unreachable"
)

func tolSeconds(v int64) *int64 { return &v }

// tolerationStrings renders tolerations as key/operator/value/effect/seconds, for comparison.
func tolerationStrings(ts []corev1.Toleration) []string {
	out := []string{}
	for _, t := range ts {
		secs := "nil"
		if t.TolerationSeconds != nil {
			secs = fmt.Sprint(*t.TolerationSeconds)
		}
		out = append(out, fmt.Sprintf("%s/%s/%s/%s/%s", t.Key, t.Operator, t.Value, t.Effect, secs))
	}
	return out
}

func TestDefaultTolerationAdmission(t *testing.T) {
	const seconds = 300
	added := func(key string) corev1.Toleration {
		return corev1.Toleration{Key: key, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: tolSeconds(seconds)}
	}
	own := func(key string, effect corev1.TaintEffect, secs *int64) corev1.Toleration {
		return corev1.Toleration{Key: key, Operator: corev1.TolerationOpExists, Effect: effect, TolerationSeconds: secs}
	}
	dedicated := corev1.Toleration{Key: "dedicated", Operator: corev1.TolerationOpEqual, Value: "infra", Effect: corev1.TaintEffectNoSchedule}
	cases := []struct {
		name        string
		tolerations []corev1.Toleration
		want        []corev1.Toleration
	}{
		{"no tolerations", nil, []corev1.Toleration{added(tolNotReady), added(tolUnreachable)}},
		{"unrelated toleration kept", []corev1.Toleration{dedicated},
			[]corev1.Toleration{dedicated, added(tolNotReady), added(tolUnreachable)}},
		{"own unreachable toleration with seconds", []corev1.Toleration{own(tolUnreachable, corev1.TaintEffectNoExecute, tolSeconds(10))},
			[]corev1.Toleration{own(tolUnreachable, corev1.TaintEffectNoExecute, tolSeconds(10)), added(tolNotReady)}},
		{"own unreachable toleration forever", []corev1.Toleration{own(tolUnreachable, corev1.TaintEffectNoExecute, nil)},
			[]corev1.Toleration{own(tolUnreachable, corev1.TaintEffectNoExecute, nil), added(tolNotReady)}},
		{"own not-ready toleration with empty effect", []corev1.Toleration{own(tolNotReady, "", nil)},
			[]corev1.Toleration{own(tolNotReady, "", nil), added(tolUnreachable)}},
		{"own not-ready toleration for NoSchedule only", []corev1.Toleration{own(tolNotReady, corev1.TaintEffectNoSchedule, nil)},
			[]corev1.Toleration{own(tolNotReady, corev1.TaintEffectNoSchedule, nil), added(tolNotReady), added(tolUnreachable)}},
		{"both own", []corev1.Toleration{own(tolNotReady, corev1.TaintEffectNoExecute, tolSeconds(1)), own(tolUnreachable, corev1.TaintEffectNoExecute, tolSeconds(2))},
			[]corev1.Toleration{own(tolNotReady, corev1.TaintEffectNoExecute, tolSeconds(1)), own(tolUnreachable, corev1.TaintEffectNoExecute, tolSeconds(2))}},
		{"Exists with empty key tolerates everything", []corev1.Toleration{own("", "", nil)}, []corev1.Toleration{own("", "", nil)}},
		{"Exists with empty key for NoExecute", []corev1.Toleration{own("", corev1.TaintEffectNoExecute, nil)}, []corev1.Toleration{own("", corev1.TaintEffectNoExecute, nil)}},
		{"Exists with empty key for NoSchedule only", []corev1.Toleration{own("", corev1.TaintEffectNoSchedule, nil)},
			[]corev1.Toleration{own("", corev1.TaintEffectNoSchedule, nil), added(tolNotReady), added(tolUnreachable)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"},
				Spec: corev1.PodSpec{Tolerations: tc.tolerations}}
			a := admission.NewAttributesRecord(pod, nil, corev1.SchemeGroupVersion.WithKind("Pod"), "default", "p",
				corev1.Resource("pods").WithVersion("v1"), "", admission.Create, &metav1.CreateOptions{}, false, nil)
			if err := newDefaultTolerationAdmission(seconds).Admit(context.Background(), a, nil); err != nil {
				t.Fatalf("Admit: %v", err)
			}
			if got, want := tolerationStrings(pod.Spec.Tolerations), tolerationStrings(tc.want); !reflect.DeepEqual(got, want) {
				t.Errorf("tolerations = %v, want %v", got, want)
			}
		})
	}
}

// TestDefaultTolerationAdmissionSecondsNotShared: each pod gets its own TolerationSeconds, so mutating one
// pod's cannot change another's or the plugin's setting.
func TestDefaultTolerationAdmissionSecondsNotShared(t *testing.T) {
	plugin := newDefaultTolerationAdmission(300)
	admit := func() *corev1.Pod {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"}}
		a := admission.NewAttributesRecord(pod, nil, corev1.SchemeGroupVersion.WithKind("Pod"), "default", "p",
			corev1.Resource("pods").WithVersion("v1"), "", admission.Create, &metav1.CreateOptions{}, false, nil)
		if err := plugin.Admit(context.Background(), a, nil); err != nil {
			t.Fatal(err)
		}
		return pod
	}
	first := admit()
	*first.Spec.Tolerations[0].TolerationSeconds = 1
	*first.Spec.Tolerations[1].TolerationSeconds = 2
	for _, tol := range admit().Spec.Tolerations {
		if tol.TolerationSeconds == nil || *tol.TolerationSeconds != 300 {
			t.Errorf("second pod's toleration %s seconds = %v, want 300", tol.Key, tol.TolerationSeconds)
		}
	}
}

func TestDefaultTolerationAdmissionUntouched(t *testing.T) {
	pod := func() *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"}}
	}
	cases := []struct {
		name        string
		obj         runtime.Object
		kind        string
		resource    string
		subresource string
	}{
		{"pods/status", pod(), "Pod", "pods", "status"},
		{"pods/binding", pod(), "Pod", "pods", "binding"},
		{"pods/ephemeralcontainers", pod(), "Pod", "pods", "ephemeralcontainers"},
		{"a service", &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"}}, "Service", "services", ""},
		{"a pod object under another resource", pod(), "Pod", "podtemplates", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := tc.obj.DeepCopyObject()
			a := admission.NewAttributesRecord(tc.obj, nil, corev1.SchemeGroupVersion.WithKind(tc.kind), "default", "p",
				corev1.Resource(tc.resource).WithVersion("v1"), tc.subresource, admission.Create, &metav1.CreateOptions{}, false, nil)
			if err := newDefaultTolerationAdmission(300).Admit(context.Background(), a, nil); err != nil {
				t.Fatalf("Admit: %v", err)
			}
			if !reflect.DeepEqual(before, tc.obj) {
				t.Errorf("object changed: %+v", tc.obj)
			}
		})
	}
}

func TestDefaultTolerationAdmissionHandles(t *testing.T) {
	plugin := newDefaultTolerationAdmission(300)
	for op, want := range map[admission.Operation]bool{
		admission.Create: true, admission.Update: true, admission.Delete: false, admission.Connect: false,
	} {
		if got := plugin.Handles(op); got != want {
			t.Errorf("Handles(%s) = %v, want %v", op, got, want)
		}
	}
}

func TestDefaultTolerationAdmissionNotAPod(t *testing.T) {
	a := admission.NewAttributesRecord(&corev1.Service{}, nil, corev1.SchemeGroupVersion.WithKind("Pod"), "default", "p",
		corev1.Resource("pods").WithVersion("v1"), "", admission.Create, &metav1.CreateOptions{}, false, nil)
	if err := newDefaultTolerationAdmission(300).Admit(context.Background(), a, nil); err == nil {
		t.Error("Admit of a non-Pod object under pods: no error")
	}
}

// TestDefaultTolerationAdmissionOnUpdate: an update that replaces a pod's tolerations gets the default ones
// back, as with Kubernetes' plugin, so that the update only adds tolerations (the conformance test of pod
// generations sets tolerations to one of its own).
func TestDefaultTolerationAdmissionOnUpdate(t *testing.T) {
	own := corev1.Toleration{Key: "foo", Operator: corev1.TolerationOpEqual, Value: "bar", Effect: corev1.TaintEffectNoSchedule}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"}, Spec: corev1.PodSpec{Tolerations: []corev1.Toleration{own}}}
	a := admission.NewAttributesRecord(pod, pod.DeepCopy(), corev1.SchemeGroupVersion.WithKind("Pod"), "default", "p",
		corev1.Resource("pods").WithVersion("v1"), "", admission.Update, &metav1.UpdateOptions{}, false, nil)
	plugin := newDefaultTolerationAdmission(300)
	if !plugin.Handles(admission.Update) {
		t.Fatal("the plugin does not handle updates")
	}
	if err := plugin.Admit(context.Background(), a, nil); err != nil {
		t.Fatal(err)
	}
	if got := tolerationStrings(pod.Spec.Tolerations); len(got) != 3 {
		t.Errorf("tolerations after the update %v; want foo and the two defaults", got)
	}
}
