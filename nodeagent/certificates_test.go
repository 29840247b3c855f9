package nodeagent

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
)

// fakeCertificates is a certificateSource: bundles by name, and one pod's credentials once issued.
type fakeCertificates struct {
	*fakeObjects
	bundles map[string]string
	key     []byte
	chain   []byte
	asked   []string
}

func (f *fakeCertificates) TrustAnchors(_ context.Context, src *corev1.ClusterTrustBundleProjection) ([]byte, error) {
	if b, ok := f.bundles[*src.Name]; ok {
		return []byte(b), nil
	}
	if src.Optional != nil && *src.Optional {
		return []byte{}, nil
	}
	return nil, fmt.Errorf("while getting ClusterTrustBundle: clustertrustbundle %q not found", *src.Name)
}

func (f *fakeCertificates) PodCredentials(_ context.Context, pod *corev1.Pod, _, volume string, sourceIndex int) ([]byte, []byte, error) {
	f.asked = append(f.asked, fmt.Sprintf("%s/%s %s[%d]", pod.Namespace, pod.Name, volume, sourceIndex))
	if f.key == nil {
		return nil, nil, errors.New("no credentials yet")
	}
	return f.key, f.chain, nil
}

// A projected volume's clusterTrustBundle and podCertificate sources are written as the kubelet writes them:
// the bundle at its path (empty when optional and missing), the key and chain at their paths and together in
// the credential bundle, with the volume's mode (0600 with an fsGroup); until the certificate is issued the
// volume fails to set up, an error worth retrying.
func TestSetupVolumesCertificateProjections(t *testing.T) {
	requireRoot(t)
	certs := &fakeCertificates{fakeObjects: newFakeObjects(), bundles: map[string]string{"ca": "CA PEM\n"}}
	pod := testPod(corev1.Volume{Name: "tls", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		DefaultMode: ptr(int32(0o644)),
		Sources: []corev1.VolumeProjection{
			{ClusterTrustBundle: &corev1.ClusterTrustBundleProjection{Name: ptr("ca"), Path: "ca.pem"}},
			{ClusterTrustBundle: &corev1.ClusterTrustBundleProjection{Name: ptr("absent"), Path: "none.pem", Optional: ptr(true)}},
			{PodCertificate: &corev1.PodCertificateProjection{SignerName: "example.com/s", KeyType: "ED25519",
				CredentialBundlePath: "creds.pem", KeyPath: "key.pem", CertificateChainPath: "chain.pem"}},
		},
	}}})
	podDir := t.TempDir()
	_, err := setupT(t, pod, podDir, certs)
	if err == nil || !strings.Contains(err.Error(), "no credentials yet") || errors.Is(err, errNotSupported) {
		t.Fatalf("before issuance: %v; want a retryable error", err)
	}
	certs.key, certs.chain = []byte("KEY\n"), []byte("CHAIN\n")
	vols, err := setupVolumes(context.Background(), pod, podDir, certs, testAllocatable, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"ca.pem": "-rw-r--r-- CA PEM\n", "none.pem": "-rw-r--r-- ", "creds.pem": "-rw-r--r-- KEY\nCHAIN\n",
		"key.pem": "-rw-r--r-- KEY\n", "chain.pem": "-rw-r--r-- CHAIN\n"}
	if got := visibleFiles(t, vols["tls"]); !reflect.DeepEqual(got, want) {
		t.Errorf("files %q, want %q", got, want)
	}
	if want := "ns/web-0 tls[2]"; len(certs.asked) != 2 || certs.asked[1] != want {
		t.Errorf("credentials asked for %q; want %q twice", certs.asked, want)
	}

	// A missing bundle that is not optional fails the volume.
	missing := testPod(corev1.Volume{Name: "tls", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		Sources: []corev1.VolumeProjection{{ClusterTrustBundle: &corev1.ClusterTrustBundleProjection{Name: ptr("absent"), Path: "ca.pem"}}}}}})
	missing.UID = "uid-2"
	if _, err := setupT(t, missing, t.TempDir(), certs); err == nil || !strings.Contains(err.Error(), `clustertrustbundle "absent" not found`) {
		t.Errorf("a missing bundle: %v", err)
	}

	// With an fsGroup, the files are the owner's only (then group-readable, as every volume file is).
	grouped := pod.DeepCopy()
	grouped.UID = "uid-3"
	grouped.Spec.SecurityContext = &corev1.PodSecurityContext{FSGroup: ptr(int64(2000))}
	vols, err = setupT(t, grouped, t.TempDir(), certs)
	if err != nil {
		t.Fatal(err)
	}
	if got := visibleFiles(t, vols["tls"])["key.pem"]; got != "-rw-r----- KEY\n" {
		t.Errorf("key.pem with an fsGroup: %q", got)
	}
}

// The agent's certificate source runs kube's managers on the node's API client: a bundle by signer and
// selector is the signer's bundles' certificates that the selector matches; a podCertificate source makes a
// key of the asked type and a PodCertificateRequest naming the pod, its service account and the node by UID,
// and serves the chain the signer issues; a change of the request kicks the pod's sync.
func TestNodeCertificates(t *testing.T) {
	caOne, caTwo, caOther := testCertPEM(t, "one"), testCertPEM(t, "two"), testCertPEM(t, "other")
	pod := testPod()
	pod.Spec.Volumes = []corev1.Volume{{Name: "tls", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		Sources: []corev1.VolumeProjection{{PodCertificate: &corev1.PodCertificateProjection{SignerName: "example.com/s", KeyType: "ECDSAP384",
			CredentialBundlePath: "creds.pem"}}}}}}}
	client := fake.NewClientset(
		&certificatesv1.ClusterTrustBundle{ObjectMeta: metav1.ObjectMeta{Name: "example.com:s:1", Labels: map[string]string{"alive": "true"}},
			Spec: certificatesv1.ClusterTrustBundleSpec{SignerName: "example.com/s", TrustBundle: caOne}},
		&certificatesv1.ClusterTrustBundle{ObjectMeta: metav1.ObjectMeta{Name: "example.com:s:2", Labels: map[string]string{"alive": "false"}},
			Spec: certificatesv1.ClusterTrustBundleSpec{SignerName: "example.com/s", TrustBundle: caTwo + caOne}},
		&certificatesv1.ClusterTrustBundle{ObjectMeta: metav1.ObjectMeta{Name: "other"},
			Spec: certificatesv1.ClusterTrustBundleSpec{TrustBundle: caOther}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a", UID: "node-uid"}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "sa", UID: "sa-uid"}},
	)
	client.Discovery().(*fakediscovery.FakeDiscovery).Resources = []*metav1.APIResourceList{
		{GroupVersion: "certificates.k8s.io/v1", APIResources: []metav1.APIResource{{Name: "clustertrustbundles"}}}}
	var named atomic.Int32 // the fake client does not generate names
	client.PrependReactor("create", "podcertificaterequests", func(action k8stesting.Action) (bool, runtime.Object, error) {
		pcr := action.(k8stesting.CreateAction).GetObject().(*certificatesv1.PodCertificateRequest)
		pcr.Name = fmt.Sprintf("%s%d", pcr.GenerateName, named.Add(1))
		pcr.CreationTimestamp = metav1.Now()
		return false, nil, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	kicked := make(chan string, 16)
	certs := newNodeCertificates(ctx, client, record.NewFakeRecorder(16), "node-a", func(key string, _ time.Duration) {
		select {
		case kicked <- key:
		default:
		}
	})

	got, err := certs.TrustAnchors(ctx, &corev1.ClusterTrustBundleProjection{SignerName: ptr("example.com/s"), LabelSelector: &metav1.LabelSelector{}})
	if err != nil {
		t.Fatal(err)
	}
	if certsIn(t, got) != certsIn(t, []byte(caOne+caTwo)) {
		t.Errorf("the signer's bundles: %s", got)
	}
	if got, err := certs.TrustAnchors(ctx, &corev1.ClusterTrustBundleProjection{SignerName: ptr("example.com/s"),
		LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"alive": "true"}}}); err != nil || string(got) != caOne {
		t.Errorf("the signer's live bundles: %s, %v", got, err)
	}
	if _, err := certs.TrustAnchors(ctx, &corev1.ClusterTrustBundleProjection{SignerName: ptr("example.com/s")}); err == nil {
		t.Error("a nil selector (none) that is not optional: no error")
	}
	if got, err := certs.TrustAnchors(ctx, &corev1.ClusterTrustBundleProjection{Name: ptr("other")}); err != nil || string(got) != caOther {
		t.Errorf("a bundle by name: %s, %v", got, err)
	}

	podDir := t.TempDir()
	if _, _, err := certs.PodCredentials(ctx, pod, podDir, "tls", 0); err == nil {
		t.Fatal("credentials before any request was issued")
	}
	var pcr *certificatesv1.PodCertificateRequest
	waitFor(t, "the PodCertificateRequest", func() error {
		list, err := client.CertificatesV1().PodCertificateRequests("ns").List(ctx, metav1.ListOptions{})
		if err != nil || len(list.Items) == 0 {
			return fmt.Errorf("none yet: %v", err)
		}
		pcr = &list.Items[0]
		return nil
	})
	want := certificatesv1.PodCertificateRequestSpec{SignerName: "example.com/s", PodName: "web-0", PodUID: "uid-1",
		ServiceAccountName: "sa", ServiceAccountUID: "sa-uid", NodeName: "node-a", NodeUID: "node-uid"}
	spec := pcr.Spec
	spec.StubPKCS10Request, spec.MaxExpirationSeconds, spec.UnverifiedUserAnnotations = nil, nil, nil
	if !reflect.DeepEqual(spec, want) {
		t.Errorf("request %+v; want %+v", spec, want)
	}
	csr, err := x509.ParseCertificateRequest(pcr.Spec.StubPKCS10Request)
	if err != nil {
		t.Fatal(err)
	}
	if k, ok := csr.PublicKey.(*ecdsa.PublicKey); !ok || k.Curve.Params().BitSize != 384 {
		t.Errorf("the request's key is %T; want ECDSA P-384", csr.PublicKey)
	}

	// The signer issues.
	chain := testCertPEM(t, "leaf")
	now := time.Now()
	pcr.Status = certificatesv1.PodCertificateRequestStatus{CertificateChain: chain,
		NotBefore: &metav1.Time{Time: now}, BeginRefreshAt: &metav1.Time{Time: now.Add(time.Hour)}, NotAfter: &metav1.Time{Time: now.Add(2 * time.Hour)},
		Conditions: []metav1.Condition{{Type: certificatesv1.PodCertificateRequestConditionTypeIssued, Status: metav1.ConditionTrue,
			Reason: "Issued", LastTransitionTime: metav1.Now()}}}
	if _, err := client.CertificatesV1().PodCertificateRequests("ns").UpdateStatus(ctx, pcr, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case key := <-kicked:
		if key != "ns/web-0" {
			t.Errorf("kicked %q", key)
		}
	case <-time.After(10 * time.Second):
		t.Error("the pod was not kicked when its request changed")
	}
	var key, gotChain []byte
	waitFor(t, "the issued credentials", func() error {
		key, gotChain, err = certs.PodCredentials(ctx, pod, podDir, "tls", 0)
		return err
	})
	if string(gotChain) != chain {
		t.Errorf("chain %q; want %q", gotChain, chain)
	}
	block, _ := pem.Decode(key)
	if block == nil {
		t.Fatalf("key %q is not PEM", key)
	}
	priv, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if !priv.(*ecdsa.PrivateKey).PublicKey.Equal(csr.PublicKey) {
		t.Error("the key is not the request's")
	}

	// Teardown forgets the pod.
	forgetPodCertificates(podDir)
	if _, ok := (*trackedPods)(certs).GetPodByUID(pod.UID); ok {
		t.Error("the pod is still tracked after its teardown")
	}
}

func testCertPEM(t *testing.T, cn string) string {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, priv)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// certsIn is the sorted common names of a PEM bundle's certificates.
func certsIn(t *testing.T, bundle []byte) string {
	t.Helper()
	var names []string
	for {
		var b *pem.Block
		if b, bundle = pem.Decode(bundle); b == nil {
			break
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, c.Subject.CommonName)
	}
	for i := range names {
		for j := i + 1; j < len(names); j++ {
			if names[j] < names[i] {
				names[i], names[j] = names[j], names[i]
			}
		}
	}
	return strings.Join(names, ",")
}

func waitFor(t *testing.T, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
