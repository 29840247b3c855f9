package apiserver_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/internal/servertest"
)

// TestPodResizeSubresource: pods/resize changes a pod's containers' cpu and memory and nothing else, bumps
// its generation, and refuses what kube-apiserver refuses (a QoS class change, a removed limit, another
// resource, a pod-level resize), with the field and kube's message. The main endpoint still refuses resource
// changes, and a pod with limits only gets requests equal to them.
func TestPodResizeSubresource(t *testing.T) {
	t.Parallel()
	shared := servertest.Shared(t)
	ns := servertest.Namespace(t, shared, "resize")
	pods := shared.Client.CoreV1().Pods(ns)
	ctx := context.Background()
	q := resource.MustParse
	pod, err := pods.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "r"}, Spec: corev1.PodSpec{Containers: []corev1.Container{
		{Name: "app", Image: "busybox", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: q("100m"), corev1.ResourceMemory: q("32Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceCPU: q("200m"), corev1.ResourceMemory: q("64Mi"), corev1.ResourceEphemeralStorage: q("1Gi")}}},
		{Name: "limits-only", Image: "busybox", Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: q("50m")}}},
	}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := pod.Spec.Containers[1].Resources.Requests.Cpu(); got.Cmp(q("50m")) != 0 {
		t.Errorf("requests of a container with limits only: cpu %s, want its limit 50m", got)
	}
	if pod.Status.QOSClass != corev1.PodQOSBurstable || pod.Generation != 1 {
		t.Fatalf("created with QoS %s, generation %d", pod.Status.QOSClass, pod.Generation)
	}

	// A resize: the cpu and memory change, the image and label it also carries do not.
	patch := `{"metadata":{"labels":{"sneaked":"in"}},"spec":{"containers":[{"name":"app","image":"other","resources":{"requests":{"cpu":"150m"},"limits":{"cpu":"300m","memory":"96Mi"}}}]}}`
	resized, err := pods.Patch(ctx, "r", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}, "resize")
	if err != nil {
		t.Fatal(err)
	}
	app := resized.Spec.Containers[0]
	if app.Image != "busybox" || resized.Labels["sneaked"] != "" {
		t.Errorf("a resize changed more than resources: image %q, labels %v", app.Image, resized.Labels)
	}
	for _, c := range []struct {
		got  resource.Quantity
		want string
	}{{app.Resources.Requests[corev1.ResourceCPU], "150m"}, {app.Resources.Limits[corev1.ResourceCPU], "300m"},
		{app.Resources.Limits[corev1.ResourceMemory], "96Mi"}, {app.Resources.Requests[corev1.ResourceMemory], "32Mi"}} {
		if c.got.Cmp(q(c.want)) != 0 {
			t.Errorf("after the resize: %s, want %s (%v)", c.got.String(), c.want, app.Resources)
		}
	}
	if resized.Generation != 2 {
		t.Errorf("generation after a resize: %d, want 2", resized.Generation)
	}
	// GET of the subresource is the pod.
	var viaResize corev1.Pod
	if err := shared.Client.CoreV1().RESTClient().Get().Namespace(ns).Resource("pods").Name("r").SubResource("resize").Do(ctx).Into(&viaResize); err != nil {
		t.Fatal(err)
	}
	if viaResize.UID != resized.UID || viaResize.Spec.Containers[0].Resources.Limits.Cpu().Cmp(q("300m")) != 0 {
		t.Errorf("GET pods/resize: %s, limits %v", viaResize.UID, viaResize.Spec.Containers[0].Resources.Limits)
	}

	for _, tc := range []struct {
		name, patch, field, message string
		json                        bool
	}{
		{"a container renamed", `[{"op":"replace","path":"/spec/containers/0/name","value":"renamed"}]`, "spec.containers[0].name", "containers may not be renamed or reordered on resize", true},
		{"a container added", `[{"op":"add","path":"/spec/containers/-","value":{"name":"more","image":"busybox"}}]`, "spec.containers", "containers may not be added or removed on resize", true},
		{"QoS class changes", `{"spec":{"containers":[{"name":"app","resources":{"requests":{"cpu":"300m","memory":"96Mi"}}},{"name":"limits-only","resources":{"limits":{"memory":"10Mi"}}}]}}`, "spec", "Pod QOS Class may not change as a result of resizing", false},
		{"limit removed", `{"spec":{"containers":[{"name":"app","resources":{"limits":{"memory":null}}}]}}`, "spec.containers[0].resources.limits", "resource limits cannot be removed", false},
		{"another resource", `{"spec":{"containers":[{"name":"app","resources":{"limits":{"ephemeral-storage":"2Gi"}}}]}}`, "spec.containers[0]", "only cpu and memory resources are mutable", false},
		{"a resize policy", `{"spec":{"containers":[{"name":"app","resizePolicy":[{"resourceName":"memory","restartPolicy":"RestartContainer"}]}]}}`, "spec.containers[0]", "only cpu and memory resources are mutable", false},
		{"requests over limits", `{"spec":{"containers":[{"name":"app","resources":{"requests":{"cpu":"400m"}}}]}}`, "spec.containers[0].resources.requests[cpu]", "must be less than or equal to cpu limit", false},
		{"pod-level resources", `{"spec":{"resources":{"limits":{"cpu":"1"}}}}`, "spec.resources", "cannot be resized", false},
	} {
		kind := types.StrategicMergePatchType
		if tc.json {
			kind = types.JSONPatchType
		}
		_, err := pods.Patch(ctx, "r", kind, []byte(tc.patch), metav1.PatchOptions{}, "resize")
		status, ok := err.(apierrors.APIStatus)
		if !ok || status.Status().Code != http.StatusUnprocessableEntity {
			t.Errorf("%s: %v, want 422", tc.name, err)
			continue
		}
		found := false
		for _, cause := range status.Status().Details.Causes {
			found = found || (cause.Field == tc.field && strings.Contains(cause.Message, tc.message))
		}
		if !found {
			t.Errorf("%s: %v, want %s: %s", tc.name, err, tc.field, tc.message)
		}
	}

	// A LimitRange bounds a resize as it bounds a new pod.
	if _, err := shared.Client.CoreV1().LimitRanges(ns).Create(ctx, &corev1.LimitRange{ObjectMeta: metav1.ObjectMeta{Name: "max"},
		Spec: corev1.LimitRangeSpec{Limits: []corev1.LimitRangeItem{{Type: corev1.LimitTypeContainer, Max: corev1.ResourceList{corev1.ResourceCPU: q("500m")}}}}},
		metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, "the LimitRange to bound a resize", 30*time.Second, func() error {
		_, err := pods.Patch(ctx, "r", types.StrategicMergePatchType, []byte(`{"spec":{"containers":[{"name":"app","resources":{"limits":{"cpu":"600m"}}}]}}`), metav1.PatchOptions{}, "resize")
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "maximum cpu usage per Container is 500m") {
			return fmt.Errorf("a resize over the LimitRange's max: %v", err)
		}
		return nil
	})

	// The main endpoint leaves resources alone.
	cur, err := pods.Get(ctx, "r", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.Containers[0].Resources.Limits[corev1.ResourceCPU] = q("400m")
	if _, err := pods.Update(ctx, cur, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) {
		t.Errorf("a resource change through the pod itself: %v, want Invalid", err)
	}

	// A resize policy is checked on create: RestartContainer in a pod that never restarts is refused.
	_, err = pods.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "never"}, Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
		Containers: []corev1.Container{{Name: "app", Image: "busybox", ResizePolicy: []corev1.ContainerResizePolicy{{ResourceName: corev1.ResourceMemory, RestartPolicy: corev1.RestartContainer}}}}}}, metav1.CreateOptions{})
	if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "spec.containers[0].resizePolicy[0].restartPolicy") {
		t.Errorf("RestartContainer in a restartPolicy Never pod: %v, want Invalid on the policy", err)
	}
}
