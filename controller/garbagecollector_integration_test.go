package controller_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/internal/servertest"
)

// TestForegroundDeletion: an owner deleted in the foreground waits for the dependents that block it and not
// for the others, and an ownership cycle (a owns b owns c owns a, every reference blocking, as the
// conformance suite's "not blocked by dependency circle" test makes it) is collected rather than deadlocked.
func TestForegroundDeletion(t *testing.T) {
	t.Parallel()
	p := servertest.Shared(t)
	ctx := context.Background()
	cms := p.Client.CoreV1().ConfigMaps(servertest.Namespace(t, p, "gc"))
	create := func(name string, finalizers ...string) *corev1.ConfigMap {
		cm, err := cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Finalizers: finalizers}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return cm
	}
	own := func(name string, owner *corev1.ConfigMap, block bool) {
		body := fmt.Sprintf(`{"metadata":{"ownerReferences":[{"apiVersion":"v1","kind":"ConfigMap","name":%q,"uid":%q,"blockOwnerDeletion":%t}]}}`,
			owner.Name, owner.UID, block)
		if _, err := cms.Patch(ctx, name, types.MergePatchType, []byte(body), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	gone := func(names ...string) {
		t.Helper()
		proctest.WaitFor(t, fmt.Sprintf("%v collected", names), 90*time.Second, func() error {
			for _, n := range names {
				if _, err := cms.Get(ctx, n, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
					return fmt.Errorf("%s: %v", n, err)
				}
			}
			return nil
		})
	}
	foreground := metav1.DeletePropagationForeground

	// Blocking and non-blocking dependents.
	parent := create("parent")
	create("held", "skiff.test/hold")
	create("loose", "skiff.test/hold")
	own("held", parent, true)
	own("loose", parent, false)
	if err := cms.Delete(ctx, "parent", metav1.DeleteOptions{PropagationPolicy: &foreground}); err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, "both dependents being deleted", 20*time.Second, func() error {
		for _, n := range []string{"held", "loose"} {
			cm, err := cms.Get(ctx, n, metav1.GetOptions{})
			if err != nil || cm.DeletionTimestamp == nil {
				return fmt.Errorf("%s: %v", n, err)
			}
		}
		return nil
	})
	time.Sleep(5 * time.Second) // two collector rounds
	if p, err := cms.Get(ctx, "parent", metav1.GetOptions{}); err != nil || p.DeletionTimestamp == nil {
		t.Fatalf("the parent went before its blocking dependent: %v", err)
	}
	release := func(name string) {
		if _, err := cms.Patch(ctx, name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	release("held")
	gone("held", "parent")
	release("loose")
	gone("loose")

	// A cycle.
	a, b, cc := create("a"), create("b"), create("c")
	own("a", cc, true)
	own("b", a, true)
	own("c", b, true)
	if err := cms.Delete(ctx, "a", metav1.DeleteOptions{PropagationPolicy: &foreground}); err != nil {
		t.Fatal(err)
	}
	gone("a", "b", "c")
}

// TestForegroundDeletionKeepsDependentsOfOtherOwners: a dependent that another, live owner holds survives
// its owner's foreground deletion and only loses its reference to that owner, as in Kubernetes (the
// conformance test "should not delete dependents that have both valid owner and owner that's waiting for
// dependents to be deleted"); the owner's own dependents go, and then the owner.
func TestForegroundDeletionKeepsDependentsOfOtherOwners(t *testing.T) {
	t.Parallel()
	p := servertest.Shared(t)
	ctx := context.Background()
	cms := p.Client.CoreV1().ConfigMaps(servertest.Namespace(t, p, "gc"))
	create := func(name string, owners ...*corev1.ConfigMap) *corev1.ConfigMap {
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name}}
		for _, o := range owners {
			cm.OwnerReferences = append(cm.OwnerReferences, metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap",
				Name: o.Name, UID: o.UID, BlockOwnerDeletion: new(true)})
		}
		cm, err := cms.Create(ctx, cm, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return cm
	}
	toGo, toStay := create("to-go"), create("to-stay")
	create("shared", toGo, toStay)
	create("only", toGo)
	foreground := metav1.DeletePropagationForeground
	if err := cms.Delete(ctx, "to-go", metav1.DeleteOptions{PropagationPolicy: &foreground}); err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, "the owner and its own dependent collected", 60*time.Second, func() error {
		for _, n := range []string{"to-go", "only"} {
			if _, err := cms.Get(ctx, n, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("%s: %v", n, err)
			}
		}
		return nil
	})
	shared, err := cms.Get(ctx, "shared", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the dependent another owner holds was deleted: %v", err)
	}
	if shared.DeletionTimestamp != nil || len(shared.OwnerReferences) != 1 || shared.OwnerReferences[0].UID != toStay.UID {
		t.Errorf("shared: deletionTimestamp %v, ownerReferences %+v; want only to-stay's", shared.DeletionTimestamp, shared.OwnerReferences)
	}
}
