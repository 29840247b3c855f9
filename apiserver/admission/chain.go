package admission

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/plugin/namespace/lifecycle"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/apiserver/pkg/util/webhook"
	"k8s.io/client-go/kubernetes"
)

// Config is what the admission chain needs beside the server's generic config.
type Config struct {
	// Client is the server's loopback client.
	Client kubernetes.Interface
	// TolerationSeconds is how long pods tolerate the not-ready and unreachable taints by default.
	TolerationSeconds int64
	// PodSecurity is the PodSecurity admission's defaults and exemptions.
	PodSecurity PodSecurityConfig
	// Certificates is the certificate plugins (CertificateApproval, CertificateSigning,
	// CertificateSubjectRestriction), built by package apiserver, which converts CSRs to kube's internal type.
	Certificates admission.ValidationInterface
	// ServiceResolver finds the endpoints of webhooks' Services.
	ServiceResolver webhook.ServiceResolver
}

// NewChain runs the admission plugins in Kubernetes' default order (kube-apiserver's AllOrderedPlugins, of
// those Skiff serves): NamespaceLifecycle, from the library; LimitRanger (limitranger.go); ServiceAccount,
// which gives pods their account and API token volume (serviceaccount.go); NodeRestriction
// (noderestriction.go); PodSecurity (podsecurity.go); Priority, which resolves a pod's priorityClassName
// (priority.go); DefaultTolerationSeconds (tolerations.go); DefaultStorageClass and
// StorageObjectInUseProtection (storage.go); RuntimeClass (runtimeclass.go); the certificate plugins (c.Certificates, package apiserver's
// certificates.go); the library's MutatingAdmissionPolicy, MutatingAdmissionWebhook, ValidatingAdmissionPolicy
// and ValidatingAdmissionWebhook (policy.go); and last, ResourceQuota (quota.go). The chain runs every plugin's
// mutation in this order, then every plugin's validation. Skiff's defaulting runs in each kind's strategy.
func NewChain(cfg *genericapiserver.RecommendedConfig, c Config) (admission.Interface, error) {
	client := c.Client
	factory, drained := cfg.SharedInformerFactory, cfg.DrainedNotify()
	nl, err := lifecycle.NewLifecycle(sets.New(metav1.NamespaceDefault, metav1.NamespaceSystem, metav1.NamespacePublic))
	if err != nil {
		return nil, err
	}
	nl.SetExternalKubeInformerFactory(factory)
	nl.SetExternalKubeClientSet(client)
	if err := nl.ValidateInitialization(); err != nil {
		return nil, err
	}
	podSecurity, err := newPodSecurity(c.PodSecurity, client, factory)
	if err != nil {
		return nil, err
	}
	policies, err := newPolicyPlugins(cfg.LoopbackClientConfig, client, factory, cfg.Authorization.Authorizer, cfg.EffectiveVersion, drained, c.ServiceResolver)
	if err != nil {
		return nil, err
	}
	quota, err := newResourceQuota(client, factory, drained)
	if err != nil {
		return nil, err
	}
	nodeRestriction := newNodeRestriction(factory.Core().V1().Pods().Lister(), factory.Core().V1().PersistentVolumes().Lister())
	nodeRestriction.podCertificates = &podCertificateRestriction{nodes: factory.Core().V1().Nodes().Lister(),
		serviceAccounts: factory.Core().V1().ServiceAccounts().Lister(), authz: cfg.Authorization.Authorizer}
	return admission.NewChainHandler(nl, newLimitRanger(factory.Core().V1().LimitRanges().Lister(), client), newServiceAccountAdmission(client, factory),
		nodeRestriction, podSecurity, newPriorityAdmission(factory),
		newDefaultTolerationAdmission(c.TolerationSeconds), newDefaultStorageClass(factory.Storage().V1().StorageClasses().Lister()),
		newStorageObjectInUseProtection(), newRuntimeClassAdmission(client, factory), c.Certificates, policies.mutatingPolicy, policies.mutating, policies.policy, policies.validating, quota), nil
}
