package apiserver

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiresource "k8s.io/apimachinery/pkg/api/resource"
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
