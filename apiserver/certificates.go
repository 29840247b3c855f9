package apiserver

import (
	"context"
	"sort"
	"strings"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/kubernetes/pkg/apis/certificates"
	kubecertificatesv1 "k8s.io/kubernetes/pkg/apis/certificates/v1"
	"k8s.io/kubernetes/pkg/apis/core"
	kubecorev1 "k8s.io/kubernetes/pkg/apis/core/v1"
	corevalidation "k8s.io/kubernetes/pkg/apis/core/validation"
	csrregistry "k8s.io/kubernetes/pkg/registry/certificates/certificates"
	ctbregistry "k8s.io/kubernetes/pkg/registry/certificates/clustertrustbundle"
	pcrregistry "k8s.io/kubernetes/pkg/registry/certificates/podcertificaterequest"
	"k8s.io/kubernetes/plugin/pkg/admission/certificates/approval"
	"k8s.io/kubernetes/plugin/pkg/admission/certificates/ctbattest"
	"k8s.io/kubernetes/plugin/pkg/admission/certificates/signing"
	"k8s.io/kubernetes/plugin/pkg/admission/certificates/subjectrestriction"
	"k8s.io/utils/clock"
)

// CertificateSigningRequests (certificates.k8s.io/v1) are Kubernetes' own contract end to end: kube's registry
// strategies (who asked is recorded from the request, approval and status only through their subresources,
// condition timestamps) and validation, and kube's CertificateApproval, CertificateSigning and
// CertificateSubjectRestriction admission plugins. They all work on kube's internal type; Skiff stores v1, so
// the objects are converted there and back with kube's generated conversions (kubestrategy.go's adapter,
// internalValidation).
//
// ClusterTrustBundles and PodCertificateRequests (certificates.k8s.io/v1, GA in 1.37; kube-apiserver serves
// their v1beta1 only when asked to, so Skiff serves v1 alone) are served the same way: kube's strategies,
// validation and printers; kube's ClusterTrustBundleAttest admission (a bundle that names a signer needs the
// `attest` verb on it); a PodCertificateRequest's status is written only through /status, by whoever may
// `sign` for its signer. A node creates requests for the pods bound to it (the Node authorizer and
// NodeRestriction, package apiserver/admission) and reads every bundle (kube's system:node role).

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

// clusterTrustBundleStrategies are kube's ClusterTrustBundle strategy: a PEM bundle of CA certificates whose
// signerName, once set, never changes and prefixes the bundle's name.
var clusterTrustBundleStrategies = &kubeStrategies{
	internal: func() runtime.Object { return &certificates.ClusterTrustBundle{} },
	main:     ctbregistry.Strategy,
}

// clusterTrustBundleFields are the field selectors kube serves for ClusterTrustBundles.
func clusterTrustBundleFields(obj runtime.Object) fields.Set {
	return fields.Set{"spec.signerName": obj.(*certificatesv1.ClusterTrustBundle).Spec.SignerName}
}

// podCertificateRequestStrategies are kube's, built per server as kube-apiserver builds them
// (pkg/registry/certificates/rest): the spec is immutable, and the status subresource checks that its writer
// may `sign` for the request's signer, with the server's authorizer.
func podCertificateRequestStrategies(d serverDeps) *kubeStrategies {
	main := pcrregistry.NewStrategy()
	return &kubeStrategies{
		internal:     func() runtime.Object { return &certificates.PodCertificateRequest{} },
		main:         main,
		subresources: map[string]kubeStrategy{"status": pcrregistry.NewStatusStrategy(main, d.authorizer, clock.RealClock{})},
	}
}

// podCertificateRequestFieldNames are the field selectors kube serves for PodCertificateRequests; a node
// lists and watches its own with spec.nodeName.
var podCertificateRequestFieldNames = []string{"spec.signerName", "spec.podName", "spec.nodeName"}

func podCertificateRequestFields(obj runtime.Object) fields.Set {
	pcr := obj.(*certificatesv1.PodCertificateRequest)
	return fields.Set{"spec.signerName": pcr.Spec.SignerName, "spec.podName": pcr.Spec.PodName, "spec.nodeName": string(pcr.Spec.NodeName)}
}

// validateCertificateProjections checks a pod's clusterTrustBundle and podCertificate projections with kube's
// own volume validation (a bundle by name or by signer and selector, a supported key type, a
// maxExpirationSeconds within [1h, 91d] or 24h for Kubernetes' signers, safe and distinct paths), reporting
// kube's errors on those sources and on their paths' conflicts. Skiff's pod validation checks the rest.
func validateCertificateProjections(pod *corev1.Pod, volumesPath *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i := range pod.Spec.Volumes {
		v := &pod.Spec.Volumes[i]
		if v.Projected == nil || !hasCertificateProjection(v.Projected) {
			continue
		}
		var internal core.Volume
		if err := kubecorev1.Convert_v1_Volume_To_core_Volume(v, &internal, nil); err != nil {
			errs = append(errs, field.InternalError(volumesPath.Index(i), err))
			continue
		}
		_, volErrs := corevalidation.ValidateVolumes([]core.Volume{internal}, &pod.ObjectMeta, volumesPath, corevalidation.PodValidationOptions{})
		prefix := volumesPath.Index(0).String()
		for _, e := range volErrs {
			rest, ok := strings.CutPrefix(e.Field, prefix)
			if !ok || !(strings.Contains(rest, ".clusterTrustBundle") || strings.Contains(rest, ".podCertificate") ||
				strings.Contains(e.Detail, "conflicting duplicate paths")) {
				continue
			}
			e.Field = volumesPath.Index(i).String() + rest
			errs = append(errs, e)
		}
	}
	return errs
}

func hasCertificateProjection(p *corev1.ProjectedVolumeSource) bool {
	for _, src := range p.Sources {
		if src.ClusterTrustBundle != nil || src.PodCertificate != nil {
			return true
		}
	}
	return false
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

// certificateAdmission is kube's certificate admission plugins, in kube-apiserver's order: CertificateApproval
// (approving a CSR needs `approve` on its signer), CertificateSigning (issuing needs `sign` on it),
// ClusterTrustBundleAttest (a bundle naming a signer needs `attest` on it) and CertificateSubjectRestriction
// (the kube-apiserver-client signer never issues for system:masters).
func certificateAdmission(authz authorizer.Authorizer) (admission.ValidationInterface, error) {
	approve, sign, attest, restrict := approval.NewPlugin(), signing.NewPlugin(), ctbattest.NewPlugin(), subjectrestriction.NewPlugin()
	approve.SetUnconditionalAuthorizer(authz)
	sign.SetUnconditionalAuthorizer(authz)
	attest.SetUnconditionalAuthorizer(authz)
	attest.InspectFeatureGates(utilfeature.DefaultFeatureGate)
	for _, p := range []admission.InitializationValidator{approve, sign, attest, restrict} {
		if err := p.ValidateInitialization(); err != nil {
			return nil, err
		}
	}
	csrs := &internalValidation{plugins: []admission.ValidationInterface{approve, sign, restrict},
		resource: certificatesv1.Resource("certificatesigningrequests"), ks: csrStrategies}
	bundles := &internalValidation{plugins: []admission.ValidationInterface{attest},
		resource: certificatesv1.Resource("clustertrustbundles"), ks: clusterTrustBundleStrategies}
	return admission.NewChainHandler(csrs, bundles), nil
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
