package apiserver

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

func TestValidateNewEphemeral(t *testing.T) {
	pod := &corev1.Pod{Spec: corev1.PodSpec{
		Containers:     []corev1.Container{{Name: "app"}},
		InitContainers: []corev1.Container{{Name: "setup"}},
	}}
	always := corev1.ContainerRestartPolicyAlways
	for _, tc := range []struct {
		name string
		edit func(c *corev1.EphemeralContainer)
		want string // the field path of the error, "" for none
	}{
		{"plain", func(*corev1.EphemeralContainer) {}, ""},
		{"targets an app container", func(c *corev1.EphemeralContainer) { c.TargetContainerName = "app" }, ""},
		{"targets an init container", func(c *corev1.EphemeralContainer) { c.TargetContainerName = "setup" }, ""},
		{"targets nothing", func(c *corev1.EphemeralContainer) { c.TargetContainerName = "nope" }, "targetContainerName"},
		{"ports", func(c *corev1.EphemeralContainer) { c.Ports = []corev1.ContainerPort{{ContainerPort: 80}} }, "ports"},
		{"probe", func(c *corev1.EphemeralContainer) { c.ReadinessProbe = &corev1.Probe{} }, "readinessProbe"},
		{"lifecycle", func(c *corev1.EphemeralContainer) { c.Lifecycle = &corev1.Lifecycle{} }, "lifecycle"},
		{"resources", func(c *corev1.EphemeralContainer) {
			c.Resources.Limits = corev1.ResourceList{corev1.ResourceCPU: apiresource.MustParse("1")}
		}, "resources"},
		{"restart policy", func(c *corev1.EphemeralContainer) { c.RestartPolicy = &always }, "restartPolicy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := corev1.EphemeralContainer{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "dbg", Image: "busybox"}}
			tc.edit(&c)
			errs := validateNewEphemeral(field.NewPath("spec", "ephemeralContainers").Index(0), &c, pod)
			switch {
			case tc.want == "" && len(errs) > 0:
				t.Fatalf("unexpected errors: %v", errs)
			case tc.want != "" && (len(errs) != 1 || !strings.HasSuffix(errs[0].Field, "."+tc.want)):
				t.Fatalf("errors %v, want one on %s", errs, tc.want)
			}
		})
	}
}

// TestEphemeralContainersBumpGeneration: adding an ephemeral container through the subresource is a change
// of the pod's spec, so metadata.generation grows by one, as kube-apiserver does; an update that adds none
// leaves it, and nothing else of the pod changes.
func TestEphemeralContainersBumpGeneration(t *testing.T) {
	var pods *kind
	for _, k := range kinds {
		if k.resource == "pods" && k.gv.Group == "" {
			pods = k
		}
	}
	st := ephemeralStrategy{newStrategy(pods)}
	old := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default", Generation: 4}, Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "app", Image: "web:1"}}}}
	same := old.DeepCopy()
	st.PrepareForUpdate(context.Background(), same, old)
	if same.Generation != 4 {
		t.Errorf("no ephemeral container added: generation %d, want 4", same.Generation)
	}
	added := old.DeepCopy()
	added.Labels = map[string]string{"ignored": "yes"}
	added.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "dbg", Image: "busybox"}}}
	st.PrepareForUpdate(context.Background(), added, old)
	if added.Generation != 5 || len(added.Spec.EphemeralContainers) != 1 || added.Labels != nil {
		t.Errorf("ephemeral container added: generation %d (want 5), %d ephemeral containers, labels %v", added.Generation, len(added.Spec.EphemeralContainers), added.Labels)
	}
}
