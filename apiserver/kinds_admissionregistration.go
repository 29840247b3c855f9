package apiserver

import (
	"context"
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/kubernetes/pkg/apis/admissionregistration"
	kubeadmissionregistrationv1 "k8s.io/kubernetes/pkg/apis/admissionregistration/v1"
	"k8s.io/kubernetes/pkg/registry/admissionregistration/mutatingadmissionpolicy"
	"k8s.io/kubernetes/pkg/registry/admissionregistration/mutatingadmissionpolicybinding"
	"k8s.io/kubernetes/pkg/registry/admissionregistration/mutatingwebhookconfiguration"
	"k8s.io/kubernetes/pkg/registry/admissionregistration/resolver"
	"k8s.io/kubernetes/pkg/registry/admissionregistration/validatingadmissionpolicy"
	"k8s.io/kubernetes/pkg/registry/admissionregistration/validatingadmissionpolicybinding"
	"k8s.io/kubernetes/pkg/registry/admissionregistration/validatingwebhookconfiguration"
)

// Admission configuration, admissionregistration.k8s.io/v1: mutating and validating webhook configurations,
// Validating and MutatingAdmissionPolicies and their bindings, with kube's registry strategies and validation (webhook
// rules, CEL expressions compiled at write, paramKind authorization) through the converting adapter
// (kubestrategy.go). The library's admission plugins enforce them (package apiserver/admission, policy.go).

func init() {
	utilruntime.Must(admissionregistration.AddToScheme(kubeScheme))
	utilruntime.Must(kubeadmissionregistrationv1.AddToScheme(kubeScheme))
}

var (
	validatingWebhookConfigurationStrategies = &kubeStrategies{
		internal: func() runtime.Object { return &admissionregistration.ValidatingWebhookConfiguration{} },
		main:     validatingwebhookconfiguration.Strategy,
	}
	mutatingWebhookConfigurationStrategies = &kubeStrategies{
		internal: func() runtime.Object { return &admissionregistration.MutatingWebhookConfiguration{} },
		main:     mutatingwebhookconfiguration.Strategy,
	}
)

// serverDeps are what some of kube's strategies need of the server they run in, so their kinds get them per
// server (kind.kubeFor).
type serverDeps struct {
	authorizer authorizer.Authorizer
	// resources resolves a paramKind's kind to its resource (discovery through the loopback client).
	resources resolver.ResourceResolver
	// stored reads a stored object of a cluster-scoped resource of this server (the policy a binding names,
	// for the checks on its paramRef).
	stored func(ctx context.Context, resource, name string) (runtime.Object, error)
	// namespaces reads Namespaces through the loopback client (a namespace's labels allow DRA admin access).
	namespaces corev1client.NamespaceInterface
}

func admissionPolicyStrategies(d serverDeps) *kubeStrategies {
	main := validatingadmissionpolicy.NewStrategy(d.authorizer, d.resources)
	return &kubeStrategies{
		internal:     func() runtime.Object { return &admissionregistration.ValidatingAdmissionPolicy{} },
		main:         main,
		subresources: map[string]kubeStrategy{"status": validatingadmissionpolicy.NewStatusStrategy(main)},
	}
}

func admissionPolicyBindingStrategies(d serverDeps) *kubeStrategies {
	return &kubeStrategies{
		internal: func() runtime.Object { return &admissionregistration.ValidatingAdmissionPolicyBinding{} },
		main:     validatingadmissionpolicybinding.NewStrategy(d.authorizer, policyGetter(d.stored), d.resources),
	}
}

// MutatingAdmissionPolicies have no status; their bindings' checks are the validating ones'.
func mutatingPolicyStrategies(d serverDeps) *kubeStrategies {
	return &kubeStrategies{
		internal: func() runtime.Object { return &admissionregistration.MutatingAdmissionPolicy{} },
		main:     mutatingadmissionpolicy.NewStrategy(d.authorizer, d.resources),
	}
}

func mutatingPolicyBindingStrategies(d serverDeps) *kubeStrategies {
	return &kubeStrategies{
		internal: func() runtime.Object { return &admissionregistration.MutatingAdmissionPolicyBinding{} },
		main:     mutatingadmissionpolicybinding.NewStrategy(d.authorizer, policyGetter(d.stored), d.resources),
	}
}

// policyGetter gives kube's binding strategies the policy a binding names, in kube's internal form.
type policyGetter func(ctx context.Context, resource, name string) (runtime.Object, error)

func (g policyGetter) GetValidatingAdmissionPolicy(ctx context.Context, name string) (*admissionregistration.ValidatingAdmissionPolicy, error) {
	var out admissionregistration.ValidatingAdmissionPolicy
	return &out, g.into(ctx, "validatingadmissionpolicies", name, &out)
}

func (g policyGetter) GetMutatingAdmissionPolicy(ctx context.Context, name string) (*admissionregistration.MutatingAdmissionPolicy, error) {
	var out admissionregistration.MutatingAdmissionPolicy
	return &out, g.into(ctx, "mutatingadmissionpolicies", name, &out)
}

func (g policyGetter) into(ctx context.Context, resource, name string, out runtime.Object) error {
	obj, err := g(ctx, resource, name)
	if err != nil {
		return err
	}
	if err := kubeScheme.Convert(obj, out, nil); err != nil {
		return fmt.Errorf("converting %s %s: %w", resource, name, err)
	}
	return nil
}
