package admission

import (
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/admission/initializer"
	mutatingpolicy "k8s.io/apiserver/pkg/admission/plugin/policy/mutating"
	validatingpolicy "k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	webhookinit "k8s.io/apiserver/pkg/admission/plugin/webhook/initializer"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/mutating"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/validating"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/apiserver/pkg/util/webhook"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	basecompatibility "k8s.io/component-base/compatibility"
	"k8s.io/kubernetes/pkg/kubeapiserver/admission/exclusion"
)

// policyPlugins are the library's MutatingAdmissionPolicy, MutatingAdmissionWebhook, ValidatingAdmissionPolicy
// and ValidatingAdmissionWebhook plugins, in that order, as kube-apiserver runs them: configured by the admissionregistration
// objects (kinds_admissionregistration.go), through this server's informers; webhooks reached through their
// Service's ready endpoints (the servers route to pod IPs; they run no service proxy), and
// kubernetes.default through the loopback connection.
type policyPlugins struct {
	mutatingPolicy, mutating, policy, validating admission.Interface
}

func newPolicyPlugins(loopback *rest.Config, client kubernetes.Interface, factory informers.SharedInformerFactory, authz authorizer.Authorizer,
	version basecompatibility.EffectiveVersion, drained <-chan struct{}, services webhook.ServiceResolver) (*policyPlugins, error) {
	dynamicClient, err := dynamic.NewForConfig(loopback)
	if err != nil {
		return nil, err
	}
	// paramKinds resolve through discovery, which is cached and, as kube-apiserver does, forgotten every
	// 30 s, so that kinds served later are found.
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(client.Discovery()))
	go func() {
		for {
			select {
			case <-drained:
				return
			case <-time.After(30 * time.Second):
				mapper.Reset()
			}
		}
	}()
	initializers := admission.PluginInitializers{
		initializer.New(client, dynamicClient, factory, authz, utilfeature.DefaultFeatureGate, version, drained, mapper),
		webhookinit.NewPluginInitializer(webhook.NewDefaultAuthenticationInfoResolverWrapper(nil, nil, loopback, nil), services),
	}
	out := &policyPlugins{}
	mutatingPolicyPlugin, err := mutatingpolicy.NewPlugin(nil)
	if err != nil {
		return nil, err
	}
	mutatingPlugin, err := mutating.NewMutatingWebhook(nil)
	if err != nil {
		return nil, err
	}
	policyPlugin, err := validatingpolicy.NewPlugin(nil)
	if err != nil {
		return nil, err
	}
	validatingPlugin, err := validating.NewValidatingAdmissionWebhook(nil)
	if err != nil {
		return nil, err
	}
	for _, p := range []struct {
		name   string
		plugin admission.Interface
		into   *admission.Interface
	}{{mutatingpolicy.PluginName, mutatingPolicyPlugin, &out.mutatingPolicy}, {mutating.PluginName, mutatingPlugin, &out.mutating}, {validatingpolicy.PluginName, policyPlugin, &out.policy}, {validating.PluginName, validatingPlugin, &out.validating}} {
		initializers.Initialize(p.plugin)
		// Reviews of access (TokenReviews, SubjectAccessReviews) are never sent to webhooks or policies.
		if e, ok := p.plugin.(interface {
			SetExcludedAdmissionResources([]schema.GroupResource)
		}); ok {
			e.SetExcludedAdmissionResources(exclusion.Excluded())
		}
		if err := admission.ValidateInitialization(p.plugin); err != nil {
			return nil, fmt.Errorf("%s: %w", p.name, err)
		}
		*p.into = p.plugin
	}
	return out, nil
}
