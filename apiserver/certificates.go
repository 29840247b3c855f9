package apiserver

import (
	"context"
	"sort"
	"strings"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/kubernetes/pkg/apis/certificates"
	kubecertificatesv1 "k8s.io/kubernetes/pkg/apis/certificates/v1"
	csrregistry "k8s.io/kubernetes/pkg/registry/certificates/certificates"
	"k8s.io/kubernetes/plugin/pkg/admission/certificates/approval"
	"k8s.io/kubernetes/plugin/pkg/admission/certificates/signing"
	"k8s.io/kubernetes/plugin/pkg/admission/certificates/subjectrestriction"
)

// CertificateSigningRequests (certificates.k8s.io/v1) are Kubernetes' own contract end to end: kube's registry
// strategies (who asked is recorded from the request, approval and status only through their subresources,
// condition timestamps) and validation, and kube's CertificateApproval, CertificateSigning and
// CertificateSubjectRestriction admission plugins. They all work on kube's internal type; Skiff stores v1, so
// the objects are converted there and back with kube's generated conversions (kubestrategy.go's adapter,
// internalValidation).

func init() {
	// kube's internal certificates types, the v1 ones, and kube's conversions between them.
	utilruntime.Must(certificates.AddToScheme(kubeScheme))
	utilruntime.Must(kubecertificatesv1.AddToScheme(kubeScheme))
}

// csrStrategies are kube's CSR strategies: the resource, /status (the signer's certificate and failure
// conditions) and /approval (Approved and Denied conditions, as `kubectl certificate approve|deny` send them).
var csrStrategies = &kubeStrategies{
	internal: func() runtime.Object { return &certificates.CertificateSigningRequest{} },
	main:     csrregistry.Strategy,
	subresources: map[string]kubeStrategy{
		"status":   csrregistry.StatusStrategy,
		"approval": csrregistry.ApprovalStrategy,
	},
}

// csrFields are the field selectors kube serves for CSRs.
func csrFields(obj runtime.Object) fields.Set {
	return fields.Set{"spec.signerName": obj.(*certificatesv1.CertificateSigningRequest).Spec.SignerName}
}

// csrColumns are `kubectl get csr`'s columns, as kube-apiserver prints them.
var csrColumns = []column{
	nameColumn, ageColumn,
	{name: "SignerName", typ: "string", value: func(obj runtime.Object) any {
		return obj.(*certificatesv1.CertificateSigningRequest).Spec.SignerName
	}},
	{name: "Requestor", typ: "string", value: func(obj runtime.Object) any {
		return obj.(*certificatesv1.CertificateSigningRequest).Spec.Username
	}},
	{name: "RequestedDuration", typ: "string", value: func(obj runtime.Object) any {
		if s := obj.(*certificatesv1.CertificateSigningRequest).Spec.ExpirationSeconds; s != nil {
			return (time.Duration(*s) * time.Second).String()
		}
		return "<none>"
	}},
	{name: "Condition", typ: "string", value: func(obj runtime.Object) any { return csrCondition(obj.(*certificatesv1.CertificateSigningRequest)) }},
}

// csrCondition is the CONDITION column: Approved, Denied, Failed (comma-joined, ",Issued" once there is a
// certificate), or Pending.
func csrCondition(csr *certificatesv1.CertificateSigningRequest) string {
	var seen []string
	for _, c := range csr.Status.Conditions {
		if c.Status == "True" || c.Status == "" {
			seen = append(seen, string(c.Type))
		}
	}
	sort.Strings(seen)
	if len(csr.Status.Certificate) > 0 {
		seen = append(seen, "Issued")
	}
	if len(seen) == 0 {
		return "Pending"
	}
	return strings.Join(seen, ",")
}

// certificateAdmission is kube's three CSR admission plugins: approving needs `approve` on the signer,
// issuing a certificate needs `sign` on it (both on certificates.k8s.io signers), and the
// kube-apiserver-client signer never issues for system:masters.
func certificateAdmission(authz authorizer.Authorizer) (admission.ValidationInterface, error) {
	approve, sign, restrict := approval.NewPlugin(), signing.NewPlugin(), subjectrestriction.NewPlugin()
	approve.SetUnconditionalAuthorizer(authz)
	sign.SetUnconditionalAuthorizer(authz)
	plugins := []admission.ValidationInterface{approve, sign, restrict}
	for _, p := range plugins {
		if err := p.(admission.InitializationValidator).ValidateInitialization(); err != nil {
			return nil, err
		}
	}
	return &internalValidation{plugins: plugins, resource: certificatesv1.Resource("certificatesigningrequests"),
		ks: csrStrategies}, nil
}

// internalValidation runs validating admission plugins written for kube's internal types on one resource,
// converting the request's v1 objects for them.
type internalValidation struct {
	plugins  []admission.ValidationInterface
	resource schema.GroupResource
	ks       *kubeStrategies
}

var _ admission.ValidationInterface = (*internalValidation)(nil)

func (v *internalValidation) Handles(op admission.Operation) bool {
	return op == admission.Create || op == admission.Update
}

func (v *internalValidation) Validate(ctx context.Context, a admission.Attributes, o admission.ObjectInterfaces) error {
	if a.GetResource().GroupResource() != v.resource {
		return nil
	}
	conv := convertingStrategy{ks: v.ks}
	attrs := &internalAttributes{Attributes: a}
	var err error
	if obj := a.GetObject(); obj != nil {
		if attrs.obj, err = conv.toInternal(obj); err != nil {
			return admission.NewForbidden(a, err)
		}
	}
	if old := a.GetOldObject(); old != nil {
		if attrs.old, err = conv.toInternal(old); err != nil {
			return admission.NewForbidden(a, err)
		}
	}
	for _, p := range v.plugins {
		if !p.Handles(a.GetOperation()) {
			continue
		}
		if err := p.Validate(ctx, attrs, o); err != nil {
			return err
		}
	}
	return nil
}

// internalAttributes are a request's admission attributes with its objects in kube's internal form.
type internalAttributes struct {
	admission.Attributes
	obj, old runtime.Object
}

func (a *internalAttributes) GetObject() runtime.Object    { return a.obj }
func (a *internalAttributes) GetOldObject() runtime.Object { return a.old }
