package admission

import (
	"context"
	"errors"
	"fmt"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/warning"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	psadmission "k8s.io/pod-security-admission/admission"
	psaconfig "k8s.io/pod-security-admission/admission/api"
	psaload "k8s.io/pod-security-admission/admission/api/load"
	psaapi "k8s.io/pod-security-admission/api"
	psametrics "k8s.io/pod-security-admission/metrics"
	"k8s.io/pod-security-admission/policy"
)

// PodSecurity is Kubernetes' Pod Security admission, from k8s.io/pod-security-admission, with the adapter
// kube-apiserver's plugin has (that one converts from kube's internal types; Skiff's objects are v1
// already): a namespace's pod-security.kubernetes.io/{enforce,audit,warn}[-version] labels (or the server's
// defaults) choose the Pod Security Standards level each pod is checked against. enforce refuses a pod that
// breaks it (403 with Kubernetes' message), warn returns `Warning:` lines (also for Deployments and the other
// kinds with a pod template, whose pods would break it), audit annotates the audit event. Labelling a
// namespace warns about its existing pods that break the new enforce level.

// PodSecurityConfig is the server's PodSecurity defaults and exemptions (server HCL pod_security).
type PodSecurityConfig struct {
	Enforce, EnforceVersion, Audit, AuditVersion, Warn, WarnVersion string
	ExemptUsernames, ExemptNamespaces, ExemptRuntimeClasses         []string
}

type podSecurity struct {
	*admission.Handler
	delegate *psadmission.Admission
}

var _ admission.ValidationInterface = &podSecurity{}

func newPodSecurity(c PodSecurityConfig, client kubernetes.Interface, factory informers.SharedInformerFactory) (*podSecurity, error) {
	// The library's loader gives the configuration its defaults; the server's settings go over them.
	cfg, err := psaload.LoadFromData(nil)
	if err != nil {
		return nil, err
	}
	if c.Enforce != "" {
		cfg.Defaults = psaconfig.PodSecurityDefaults{Enforce: c.Enforce, EnforceVersion: c.EnforceVersion,
			Audit: c.Audit, AuditVersion: c.AuditVersion, Warn: c.Warn, WarnVersion: c.WarnVersion}
	}
	cfg.Exemptions = psaconfig.PodSecurityExemptions{Usernames: c.ExemptUsernames, Namespaces: c.ExemptNamespaces,
		RuntimeClasses: c.ExemptRuntimeClasses}
	evaluator, err := policy.NewEvaluator(policy.DefaultChecks(), nil)
	if err != nil {
		return nil, err
	}
	recorder := psametrics.NewPrometheusRecorder(psaapi.GetAPIVersion())
	delegate := &psadmission.Admission{
		Configuration:    cfg,
		Evaluator:        evaluator,
		Metrics:          recorder,
		PodSpecExtractor: psadmission.DefaultPodSpecExtractor{},
		NamespaceGetter:  psadmission.NamespaceGetterFromListerAndClient(factory.Core().V1().Namespaces().Lister(), client),
		PodLister:        psadmission.PodListerFromInformer(factory.Core().V1().Pods().Lister()),
	}
	if err := delegate.CompleteConfiguration(); err != nil {
		return nil, err
	}
	if err := delegate.ValidateConfiguration(); err != nil {
		return nil, fmt.Errorf("pod_security: %w", err)
	}
	return &podSecurity{Handler: admission.NewHandler(admission.Create, admission.Update), delegate: delegate}, nil
}

func (p *podSecurity) Validate(ctx context.Context, a admission.Attributes, _ admission.ObjectInterfaces) error {
	gr := a.GetResource().GroupResource()
	if gr != corev1.Resource("namespaces") && !p.delegate.PodSpecExtractor.HasPodSpec(gr) {
		return nil
	}
	result := p.delegate.Validate(ctx, podSecurityAttributes{a})
	for _, w := range result.Warnings {
		warning.AddWarning(ctx, "", w)
	}
	for k, v := range result.AuditAnnotations {
		_ = a.AddAnnotation(psaapi.AuditAnnotationPrefix+k, v)
	}
	if result.Allowed {
		return nil
	}
	forbidden := admission.NewForbidden(a, errors.New("Not allowed by PodSecurity"))
	var status *apierrors.StatusError
	if errors.As(forbidden, &status) && result.Result != nil {
		if result.Result.Message != "" {
			status.ErrStatus.Message = result.Result.Message
		}
		if result.Result.Reason != "" {
			status.ErrStatus.Reason = result.Result.Reason
		}
		if result.Result.Details != nil {
			status.ErrStatus.Details = result.Result.Details
		}
		if result.Result.Code != 0 {
			status.ErrStatus.Code = result.Result.Code
		}
	}
	return forbidden
}

// podSecurityAttributes are the request's attributes as the library reads them; Skiff's objects are v1.
type podSecurityAttributes struct{ a admission.Attributes }

func (p podSecurityAttributes) GetName() string      { return p.a.GetName() }
func (p podSecurityAttributes) GetNamespace() string { return p.a.GetNamespace() }
func (p podSecurityAttributes) GetResource() schema.GroupVersionResource {
	return p.a.GetResource()
}
func (p podSecurityAttributes) GetKind() schema.GroupVersionKind   { return p.a.GetKind() }
func (p podSecurityAttributes) GetSubresource() string             { return p.a.GetSubresource() }
func (p podSecurityAttributes) GetUserName() string                { return p.a.GetUserInfo().GetName() }
func (p podSecurityAttributes) GetObject() (runtime.Object, error) { return p.a.GetObject(), nil }
func (p podSecurityAttributes) GetOldObject() (runtime.Object, error) {
	return p.a.GetOldObject(), nil
}
func (p podSecurityAttributes) GetOperation() admissionv1.Operation {
	switch p.a.GetOperation() {
	case admission.Create:
		return admissionv1.Create
	case admission.Update:
		return admissionv1.Update
	case admission.Delete:
		return admissionv1.Delete
	case admission.Connect:
		return admissionv1.Connect
	}
	return ""
}
