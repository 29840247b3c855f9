package admission

import (
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/plugin/resourcequota"
	resourcequotaapi "k8s.io/apiserver/pkg/admission/plugin/resourcequota/apis/resourcequota"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"

	"github.com/skiff-dev/skiff/internal/quotaconfig"
)

// ResourceQuota is the library's admission plugin (k8s.io/apiserver/pkg/admission/plugin/resourcequota) with
// Kubernetes' evaluators for pods (count; requests and limits of cpu, memory, ephemeral-storage and extended
// resources; the Terminating, NotTerminating, BestEffort, NotBestEffort and PriorityClass scopes), services
// (count, node ports, load balancers) and claims (count, storage, per StorageClass), which read v1 objects,
// and object counts (count/<resource>.<group>) of every other kind. It charges a create against the
// namespace's quotas by updating their status.used with the quota's resourceVersion as precondition: a
// compare-and-swap in Skiff's Raft store, so concurrent creates through different servers cannot both take
// the last unit. Kubernetes' resource quota controller (controller/resourcequota.go), with the same
// evaluators (internal/quotaconfig), recomputes status.used from what exists, which also gives back what
// failed creates charged.

// newResourceQuota builds the quota admission plugin; drained closes when the server has drained its
// requests, which stops the plugin's workers.
func newResourceQuota(client kubernetes.Interface, factory informers.SharedInformerFactory, drained <-chan struct{}) (admission.Interface, error) {
	// Five workers, as kube-apiserver runs it.
	plugin, err := resourcequota.NewResourceQuota(&resourcequotaapi.Configuration{}, 5)
	if err != nil {
		return nil, err
	}
	config, err := quotaconfig.New(factory, nil)
	if err != nil {
		return nil, err
	}
	plugin.SetDrainedNotification(drained)
	plugin.SetExternalKubeClientSet(client)
	plugin.SetExternalKubeInformerFactory(factory)
	plugin.SetQuotaConfiguration(config)
	if err := plugin.ValidateInitialization(); err != nil {
		return nil, err
	}
	return plugin, nil
}
