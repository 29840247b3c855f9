package apiserver_test

import (
	"context"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"github.com/skiff-dev/skiff/internal/servertest"
)

// TestGeneration: metadata.generation starts at 1 and grows with each change of the spec, and only then:
// metadata and status writes leave it alone, whatever generation the client sends.
func TestGeneration(t *testing.T) {
	t.Parallel()
	shared := servertest.Shared(t)
	c := shared.Client
	ns := servertest.Namespace(t, shared, "generation")
	ctx := context.Background()
	rsClient := c.AppsV1().ReplicaSets(ns)
	labels := map[string]string{"app": "gen"}
	rs, err := rsClient.Create(ctx, &appsv1.ReplicaSet{
		ObjectMeta: metav1.ObjectMeta{Name: "gen", Generation: 7},
		Spec: appsv1.ReplicaSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: labels},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i"}}},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		what  string
		patch string
		want  int64
	}{
		{"created", "", 1},
		{"spec.replicas changed", `{"spec":{"replicas":3}}`, 2},
		{"only a label changed", `{"metadata":{"labels":{"x":"y"}}}`, 2},
		{"the client sends a generation", `{"metadata":{"generation":40}}`, 2},
		{"the template changed", `{"spec":{"template":{"spec":{"containers":[{"name":"c","image":"j"}]}}}}`, 3},
		{"the same spec again", `{"spec":{"replicas":3}}`, 3},
	}
	for _, step := range steps {
		if step.patch != "" {
			if rs, err = rsClient.Patch(ctx, "gen", types.StrategicMergePatchType, []byte(step.patch), metav1.PatchOptions{}); err != nil {
				t.Fatalf("%s: %v", step.what, err)
			}
		}
		if rs.Generation != step.want {
			t.Fatalf("%s: generation %d, want %d", step.what, rs.Generation, step.want)
		}
	}
	// The ReplicaSet controller writes this status too, so a write may meet a newer version: read and retry.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := rsClient.Get(ctx, "gen", metav1.GetOptions{})
		if err != nil {
			return err
		}
		cur.Status.Replicas = 3
		rs, err = rsClient.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if rs.Generation != 3 {
		t.Fatalf("after a status write: generation %d, want 3", rs.Generation)
	}
}
