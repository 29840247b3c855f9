package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	svmv1 "k8s.io/api/storagemigration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
)

// The migrator's condition reasons and how long an unknown resource is looked for, as Kubernetes' storage
// version migrator (a CRD may be created just after its migration).
const (
	migrationRunningReason   = "StorageVersionMigrationInProgress"
	migrationSucceededReason = "StorageVersionMigrationSucceeded"
	migrationFailedReason    = "StorageVersionMigrationFailed"
	migrationDiscoveryGrace  = time.Minute
	migrationPageSize        = 500
)

// buildStorageVersionMigrator builds the controller that runs StorageVersionMigrations, as
// kube-controller-manager's storage version migrator does: every object of the named resource that existed
// when the migration started gets an empty merge patch conditioned on its resourceVersion. The store skips a
// write that changes nothing, and rewrites an object it holds in an older form (encrypted with a key that is
// no longer the first, or in another encoding); a conflict or a NotFound means someone else rewrote or
// removed the object, which is as good. The migration ends Succeeded, or Failed when the resource is unknown
// a minute after the migration was created or a patch fails for good.
func buildStorageVersionMigrator(ctx context.Context, c *Clients) (func(), error) {
	migrations := c.Informers.Storagemigration().V1().StorageVersionMigrations()
	m := &migrator{c: c, mapper: c.restMapper, lister: migrations.Lister().Get}
	queue := newKeyQueue(queueConfig{what: "storageversionmigration", logger: c.Logger.Named("storageversionmigration"), sync: m.sync})
	if _, err := migrations.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    queue.addObject,
		UpdateFunc: func(_, obj any) { queue.addObject(obj) },
	}); err != nil {
		return nil, err
	}
	return func() { queue.run(ctx, c, migrations.Informer().HasSynced) }, nil
}

type migrator struct {
	c      *Clients
	mapper meta.ResettableRESTMapper
	lister func(name string) (*svmv1.StorageVersionMigration, error)
}

func (m *migrator) sync(ctx context.Context, name string) (time.Duration, error) {
	svm, err := m.lister(name)
	if apierrors.IsNotFound(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	if meta.IsStatusConditionTrue(svm.Status.Conditions, string(svmv1.MigrationSucceeded)) ||
		meta.IsStatusConditionTrue(svm.Status.Conditions, string(svmv1.MigrationFailed)) {
		return 0, nil
	}
	gr := schema.GroupResource{Group: svm.Spec.Resource.Group, Resource: svm.Spec.Resource.Resource}
	gvr, err := m.mapper.ResourceFor(gr.WithVersion(""))
	if err != nil {
		if time.Since(svm.CreationTimestamp.Time) < migrationDiscoveryGrace {
			m.mapper.Reset()
			return 5 * time.Second, nil
		}
		return 0, m.finish(ctx, svm, svmv1.MigrationFailed, migrationFailedReason, fmt.Sprintf("unable to obtain GVR from discovery: %v", err))
	}
	gvk, err := m.mapper.KindFor(gvr)
	if err != nil {
		return 0, m.finish(ctx, svm, svmv1.MigrationFailed, migrationFailedReason, err.Error())
	}
	migrated, total := 0, 0
	opts := metav1.ListOptions{Limit: migrationPageSize}
	for {
		page, err := m.c.Metadata.Resource(gvr).List(ctx, opts)
		if err != nil {
			return 0, err
		}
		if svm.Status.ResourceVersion == "" {
			// The migration's checkpoint: what its first page was read at.
			svm = svm.DeepCopy()
			svm.Status.ResourceVersion = page.ResourceVersion
			meta.SetStatusCondition(&svm.Status.Conditions, metav1.Condition{Type: string(svmv1.MigrationRunning),
				Status: metav1.ConditionTrue, Reason: migrationRunningReason, Message: "Migration started"})
			if svm, err = m.c.Kube.StoragemigrationV1().StorageVersionMigrations().UpdateStatus(ctx, svm, metav1.UpdateOptions{}); err != nil {
				return 0, err
			}
		}
		for _, item := range page.Items {
			total++
			patch, _ := json.Marshal(map[string]any{"apiVersion": gvk.GroupVersion().String(), "kind": gvk.Kind,
				"metadata": map[string]any{"resourceVersion": item.ResourceVersion}})
			patched, err := m.c.Dynamic.Resource(gvr).Namespace(item.Namespace).Patch(ctx, item.Name, types.MergePatchType, patch,
				metav1.PatchOptions{FieldManager: "storage-version-migrator-controller"})
			switch {
			case err == nil:
				if patched.GetResourceVersion() != item.ResourceVersion {
					migrated++ // the store wrote it again; an object already current is not written
				}
			case apierrors.IsConflict(err), apierrors.IsNotFound(err):
			case apierrors.IsTooManyRequests(err), apierrors.IsServerTimeout(err), apierrors.IsServiceUnavailable(err), apierrors.IsTimeout(err):
				return 0, err
			default:
				return 0, m.finish(ctx, svm, svmv1.MigrationFailed, migrationFailedReason,
					fmt.Sprintf("migrating %s %s/%s: %v", gr, item.Namespace, item.Name, err))
			}
		}
		if page.Continue == "" {
			break
		}
		opts.Continue = page.Continue
	}
	return 0, m.finish(ctx, svm, svmv1.MigrationSucceeded, migrationSucceededReason,
		fmt.Sprintf("Migration completed: %d of %d objects rewritten", migrated, total))
}

// finish records the migration's end: Running goes False, and the final condition True.
func (m *migrator) finish(ctx context.Context, svm *svmv1.StorageVersionMigration, cond svmv1.MigrationConditionType, reason, message string) error {
	svm = svm.DeepCopy()
	if meta.FindStatusCondition(svm.Status.Conditions, string(svmv1.MigrationRunning)) != nil {
		meta.SetStatusCondition(&svm.Status.Conditions, metav1.Condition{Type: string(svmv1.MigrationRunning),
			Status: metav1.ConditionFalse, Reason: reason, Message: message})
	}
	meta.SetStatusCondition(&svm.Status.Conditions, metav1.Condition{Type: string(cond), Status: metav1.ConditionTrue, Reason: reason, Message: message})
	_, err := m.c.Kube.StoragemigrationV1().StorageVersionMigrations().UpdateStatus(ctx, svm, metav1.UpdateOptions{})
	return err
}
