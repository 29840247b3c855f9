package controller_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	svmv1 "k8s.io/api/storagemigration/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/internal/servertest"
)

// TestStorageVersionMigration: a StorageVersionMigration of ConfigMaps runs to Succeeded, with its checkpoint
// resourceVersion and a count of the objects it patched; objects the store holds in the current form are not
// written again (their resourceVersions stay).
func TestStorageVersionMigration(t *testing.T) {
	t.Parallel()
	c := servertest.Shared(t).Client
	ctx := context.Background()
	const ns = "svm-test"
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	versions := map[string]string{}
	for i := range 3 {
		cm, err := c.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%d", i)},
			Data: map[string]string{"k": "v"}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		versions[cm.Name] = cm.ResourceVersion
	}
	if _, err := c.StoragemigrationV1().StorageVersionMigrations().Create(ctx, &svmv1.StorageVersionMigration{
		ObjectMeta: metav1.ObjectMeta{Name: "configmaps"},
		Spec:       svmv1.StorageVersionMigrationSpec{Resource: metav1.GroupResource{Resource: "configmaps"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	proctest.WaitFor(t, "the migration to succeed", 60*time.Second, func() error {
		svm, err := c.StoragemigrationV1().StorageVersionMigrations().Get(ctx, "configmaps", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(svm.Status.Conditions, string(svmv1.MigrationSucceeded)) {
			return fmt.Errorf("conditions %+v", svm.Status.Conditions)
		}
		if svm.Status.ResourceVersion == "" || meta.IsStatusConditionTrue(svm.Status.Conditions, string(svmv1.MigrationRunning)) {
			return fmt.Errorf("status %+v: want a checkpoint and Running false", svm.Status)
		}
		// Every ConfigMap of the cluster was patched (at least these 3), none needed writing again.
		var rewritten, total int
		msg := meta.FindStatusCondition(svm.Status.Conditions, string(svmv1.MigrationSucceeded)).Message
		if _, err := fmt.Sscanf(msg, "Migration completed: %d of %d objects rewritten", &rewritten, &total); err != nil || rewritten != 0 || total < 3 {
			return fmt.Errorf("message %q", msg)
		}
		return nil
	})
	for name, rv := range versions {
		cm, err := c.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if cm.ResourceVersion != rv {
			t.Errorf("%s was written again (resourceVersion %s, was %s) though its stored form is current", name, cm.ResourceVersion, rv)
		}
	}
}
