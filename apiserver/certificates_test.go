package apiserver

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"strings"
	"testing"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"
)

func csrPEM(t *testing.T, cn string, orgs ...string) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn, Organization: orgs}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

func newCSR(name, signer string, request []byte) *certificatesv1.CertificateSigningRequest {
	return &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: certificatesv1.CertificateSigningRequestSpec{Request: request, SignerName: signer,
			Usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
			// A requester cannot name who asked, nor pre-approve: both are replaced.
			Username: "someone-else", Groups: []string{"system:masters"}},
		Status: certificatesv1.CertificateSigningRequestStatus{Conditions: []certificatesv1.CertificateSigningRequestCondition{
			{Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue}}}}
}

func csrStores(t *testing.T) map[string]rest.Storage {
	t.Helper()
	getter := &restOptionsGetter{backend: NewMemBackend()}
	for _, k := range kinds {
		if k.gv == certificatesv1.SchemeGroupVersion {
			storages, err := k.restStorage(getter)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(storages[k.resource].(*resource).Store.DestroyFunc)
			return storages
		}
	}
	t.Fatal("no certificatesigningrequests kind")
	return nil
}

func requestBy(u user.Info) context.Context {
	return genericapirequest.WithUser(genericapirequest.WithNamespace(context.Background(), ""), u)
}

// Kubernetes' CSR strategies run on Skiff's v1 store: the requester is recorded from the request, a create
// cannot pre-approve, approval goes only through /approval and the certificate only through /status, and
// kube's validation reports bad requests with their field paths.
func TestCSRStrategies(t *testing.T) {
	stores := csrStores(t)
	main := stores["certificatesigningrequests"].(*resource)
	bob := &user.DefaultInfo{Name: "system:bootstrap:abc", Groups: []string{"system:bootstrappers", user.AllAuthenticated}}

	created, err := main.Create(requestBy(bob), newCSR("node-csr", certificatesv1.KubeAPIServerClientKubeletSignerName, csrPEM(t, "system:node:n1", "system:nodes")),
		rest.ValidateAllObjectFunc, &metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	csr := created.(*certificatesv1.CertificateSigningRequest)
	if csr.Spec.Username != bob.Name || strings.Join(csr.Spec.Groups, ",") != "system:bootstrappers,system:authenticated" {
		t.Errorf("requester recorded as %q %v, want the request's user", csr.Spec.Username, csr.Spec.Groups)
	}
	if len(csr.Status.Conditions) != 0 {
		t.Errorf("a create kept its conditions: %v", csr.Status.Conditions)
	}

	// The main resource changes neither spec nor status.
	upd := csr.DeepCopy()
	upd.Spec.SignerName = "example.com/other"
	upd.Status.Certificate = []byte("x")
	got, _, err := main.Update(requestBy(bob), upd.Name, rest.DefaultUpdatedObjectInfo(upd), rest.ValidateAllObjectFunc, rest.ValidateAllObjectUpdateFunc, false, &metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if g := got.(*certificatesv1.CertificateSigningRequest); g.Spec.SignerName != csr.Spec.SignerName || len(g.Status.Certificate) != 0 {
		t.Errorf("the main resource changed spec or status: %+v", g)
	}

	// /approval takes the conditions, with their timestamps filled in, and nothing else.
	approve := got.(*certificatesv1.CertificateSigningRequest).DeepCopy()
	approve.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: "Test"}}
	approve.Status.Certificate = []byte("x")
	approved, _, err := stores["certificatesigningrequests/approval"].(rest.Updater).Update(requestBy(rbacAdmin), approve.Name, rest.DefaultUpdatedObjectInfo(approve),
		rest.ValidateAllObjectFunc, rest.ValidateAllObjectUpdateFunc, false, &metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a := approved.(*certificatesv1.CertificateSigningRequest)
	if csrCondition(a) != "Approved" || a.Status.Conditions[0].LastUpdateTime.IsZero() || len(a.Status.Certificate) != 0 {
		t.Errorf("after /approval: condition %q, conditions %+v, certificate %q", csrCondition(a), a.Status.Conditions, a.Status.Certificate)
	}

	// Bad input: kube's messages with their field paths.
	for _, tc := range []struct {
		name, signer string
		request      []byte
		want         string
	}{
		{"garbage", certificatesv1.KubeAPIServerClientSignerName, []byte("not a CSR"), "spec.request: Invalid value"},
		{"no-domain", "not-qualified", csrPEM(t, "alice"), "spec.signerName: Invalid value"},
		{"no-signer", "", csrPEM(t, "alice"), "spec.signerName: Required value"},
	} {
		_, err := main.Create(requestBy(bob), newCSR(tc.name, tc.signer, tc.request), rest.ValidateAllObjectFunc, &metav1.CreateOptions{})
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want 422 with %q", tc.name, err, tc.want)
		}
	}
}

// kube's CertificateApproval, CertificateSigning and CertificateSubjectRestriction plugins run on v1 objects.
func TestCertificateAdmission(t *testing.T) {
	var fa rbacFakeAuthorizer
	plugin, err := certificateAdmission(fa.authorizer())
	if err != nil {
		t.Fatal(err)
	}
	alice := &user.DefaultInfo{Name: "alice", Groups: []string{user.AllAuthenticated}}
	gvr := certificatesv1.SchemeGroupVersion.WithResource("certificatesigningrequests")
	gvk := certificatesv1.SchemeGroupVersion.WithKind("CertificateSigningRequest")
	pending := newCSR("c", certificatesv1.KubeAPIServerClientSignerName, csrPEM(t, "alice"))
	pending.Status = certificatesv1.CertificateSigningRequestStatus{}
	approved := pending.DeepCopy()
	approved.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue}}
	issued := approved.DeepCopy()
	issued.Status.Certificate = []byte("-----BEGIN CERTIFICATE-----\n")
	masters := newCSR("m", certificatesv1.KubeAPIServerClientSignerName, csrPEM(t, "root", "system:masters"))

	allowVerb := func(verb string) func(authorizer.Attributes) bool {
		return func(a authorizer.Attributes) bool {
			return a.GetVerb() == verb && a.GetResource() == "signers" && a.GetName() == certificatesv1.KubeAPIServerClientSignerName
		}
	}
	for _, tc := range []struct {
		name        string
		obj, old    runtime.Object
		subresource string
		op          admission.Operation
		allow       func(authorizer.Attributes) bool
		want        string // "" allowed
	}{
		{"approve without approve on the signer", approved, pending, "approval", admission.Update, nil, "user not permitted to approve"},
		{"approve with it", approved, pending, "approval", admission.Update, allowVerb("approve"), ""},
		{"issue without sign on the signer", issued, approved, "status", admission.Update, allowVerb("approve"), "user not permitted to sign"},
		{"issue with it", issued, approved, "status", admission.Update, allowVerb("sign"), ""},
		{"system:masters from the client signer", masters, nil, "", admission.Create, nil, "system:masters group is not allowed"},
		{"an ordinary create", pending, nil, "", admission.Create, nil, ""},
	} {
		fa.set(tc.allow)
		attrs := admission.NewAttributesRecord(tc.obj, tc.old, gvk, "", "c", gvr, tc.subresource, tc.op, nil, false, alice)
		err := plugin.Validate(context.Background(), attrs, nil)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.name, err)
		case tc.want != "" && (!apierrors.IsForbidden(err) || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: err %v, want 403 with %q", tc.name, err, tc.want)
		}
	}
}
