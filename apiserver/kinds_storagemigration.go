package apiserver

import (
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/kubernetes/pkg/apis/storagemigration"
	kubestoragemigrationv1 "k8s.io/kubernetes/pkg/apis/storagemigration/v1"
	svmregistry "k8s.io/kubernetes/pkg/registry/storagemigration/storagemigration"
)

// storagemigration.k8s.io/v1 StorageVersionMigrations, with kube's registry strategies and validation (the
// spec immutable, status only through /status). Skiff's migrator (controller/storageversionmigration.go)
// rewrites every object of the named resource that the store holds in an older form, such as a Secret
// encrypted with a key that is no longer the first.

func init() {
	utilruntime.Must(storagemigration.AddToScheme(kubeScheme))
	utilruntime.Must(kubestoragemigrationv1.AddToScheme(kubeScheme))
}

var storageVersionMigrationStrategies = &kubeStrategies{
	internal:     func() runtime.Object { return &storagemigration.StorageVersionMigration{} },
	main:         svmregistry.Strategy,
	subresources: map[string]kubeStrategy{"status": svmregistry.StatusStrategy},
}
