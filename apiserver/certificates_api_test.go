package apiserver_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/skiff-dev/skiff/apiserver"
	"github.com/skiff-dev/skiff/internal/proctest"
)

func testCAPEM(t *testing.T, cn string) string {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn}, IsCA: true, BasicConstraintsValid: true,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, priv)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

func impersonating(config *rest.Config, name string, groups ...string) kubernetes.Interface {
	c := rest.CopyConfig(config)
	c.Impersonate = rest.ImpersonationConfig{UserName: name, Groups: append(groups, "system:authenticated")}
	return kubernetes.NewForConfigOrDie(c)
}

// TestClusterTrustBundlesAndPodCertificateRequests: certificates.k8s.io/v1 serves ClusterTrustBundles and
// PodCertificateRequests as kube-apiserver 1.37 does by default: kube's validation (field paths), the
// spec.signerName (and PCR spec.podName, spec.nodeName) field selectors, watch, status only through /status by
// a user who may `sign`, ClusterTrustBundleAttest, and a node's access as the Node authorizer, NodeRestriction
// and kube's system:node role give it: it reads bundles, and creates, gets and lists (by its node name) only
// the requests of the pods bound to it.
func TestClusterTrustBundlesAndPodCertificateRequests(t *testing.T) {
	t.Parallel()
	config := apiserver.StartTestAPI(t, apiserver.TestAPIOptions{})
	cs := kubernetes.NewForConfigOrDie(config)
	ctx := context.Background()
	certs := cs.CertificatesV1()

	resources, err := cs.Discovery().ServerResourcesForGroupVersion("certificates.k8s.io/v1")
	if err != nil {
		t.Fatal(err)
	}
	served := map[string]bool{}
	for _, r := range resources.APIResources {
		served[r.Name] = true
	}
	for _, name := range []string{"clustertrustbundles", "podcertificaterequests", "podcertificaterequests/status"} {
		if !served[name] {
			t.Errorf("discovery of certificates.k8s.io/v1 lacks %s: %v", name, served)
		}
	}

	t.Run("ClusterTrustBundle", func(t *testing.T) {
		bundles := certs.ClusterTrustBundles()
		_, err := bundles.Create(ctx, &certificatesv1.ClusterTrustBundle{ObjectMeta: metav1.ObjectMeta{Name: "empty"}}, metav1.CreateOptions{})
		wantInvalidField(t, err, "spec.trustBundle")
		// A bundle naming a signer is named after it.
		_, err = bundles.Create(ctx, &certificatesv1.ClusterTrustBundle{ObjectMeta: metav1.ObjectMeta{Name: "other"},
			Spec: certificatesv1.ClusterTrustBundleSpec{SignerName: "example.com/signer", TrustBundle: testCAPEM(t, "a")}}, metav1.CreateOptions{})
		wantInvalidField(t, err, "metadata.name")

		w, err := bundles.Watch(ctx, metav1.ListOptions{FieldSelector: "spec.signerName=example.com/signer"})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		signed := &certificatesv1.ClusterTrustBundle{ObjectMeta: metav1.ObjectMeta{Name: "example.com:signer:one", Labels: map[string]string{"alive": "true"}},
			Spec: certificatesv1.ClusterTrustBundleSpec{SignerName: "example.com/signer", TrustBundle: testCAPEM(t, "one")}}
		created, err := bundles.Create(ctx, signed, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = bundles.Delete(context.Background(), signed.Name, metav1.DeleteOptions{}) })
		unsigned := &certificatesv1.ClusterTrustBundle{ObjectMeta: metav1.ObjectMeta{Name: "plain"},
			Spec: certificatesv1.ClusterTrustBundleSpec{TrustBundle: testCAPEM(t, "plain")}}
		if _, err := bundles.Create(ctx, unsigned, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = bundles.Delete(context.Background(), unsigned.Name, metav1.DeleteOptions{}) })

		list, err := bundles.List(ctx, metav1.ListOptions{FieldSelector: "spec.signerName=example.com/signer"})
		if err != nil || len(list.Items) != 1 || list.Items[0].Name != signed.Name {
			t.Fatalf("list by signer: %+v, %v", list, err)
		}
		if _, err := bundles.List(ctx, metav1.ListOptions{FieldSelector: "spec.trustBundle=x"}); !apierrors.IsBadRequest(err) {
			t.Errorf("an unknown field selector: %v; want 400", err)
		}
		created.Spec.TrustBundle = testCAPEM(t, "two")
		if created, err = bundles.Update(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		created.Spec.SignerName = "example.com/another"
		if _, err := bundles.Update(ctx, created, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) {
			t.Errorf("changing the signer: %v; want 422", err)
		}
		for _, want := range []watch.EventType{watch.Added, watch.Modified} {
			select {
			case ev := <-w.ResultChan():
				if ev.Type != want || ev.Object.(*certificatesv1.ClusterTrustBundle).Name != signed.Name {
					t.Fatalf("watch: %s %v; want %s of %s", ev.Type, ev.Object, want, signed.Name)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("no %s event", want)
			}
		}

		// ClusterTrustBundleAttest: a user who may write bundles must also `attest` for the signer.
		writer := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "ctb-writer"}, Rules: []rbacv1.PolicyRule{
			{Verbs: []string{"create", "get"}, APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"clustertrustbundles"}}}}
		attester := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "ctb-attester"}, Rules: []rbacv1.PolicyRule{
			{Verbs: []string{"attest"}, APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"signers"}, ResourceNames: []string{"example.com/*"}}}}
		for _, role := range []*rbacv1.ClusterRole{writer, attester} {
			if _, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cs.RbacV1().ClusterRoles().Delete(context.Background(), role.Name, metav1.DeleteOptions{}) })
		}
		bind := func(role string) {
			b := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role + "-alice"},
				RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role},
				Subjects: []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: "alice"}}}
			if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = cs.RbacV1().ClusterRoleBindings().Delete(context.Background(), b.Name, metav1.DeleteOptions{})
			})
		}
		bind("ctb-writer")
		alice := impersonating(config, "alice").CertificatesV1().ClusterTrustBundles()
		proctest.WaitFor(t, "alice's role", 30*time.Second, func() error {
			_, err := alice.Get(ctx, signed.Name, metav1.GetOptions{})
			return err
		})
		attested := &certificatesv1.ClusterTrustBundle{ObjectMeta: metav1.ObjectMeta{Name: "example.com:signer:alice"},
			Spec: certificatesv1.ClusterTrustBundleSpec{SignerName: "example.com/signer", TrustBundle: testCAPEM(t, "alice")}}
		_, err = alice.Create(ctx, attested, metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `user not permitted to attest for signerName "example.com/signer"`) {
			t.Fatalf("alice creating a bundle without attest: %v; want 403", err)
		}
		// A bundle without a signer needs no attest.
		plain := &certificatesv1.ClusterTrustBundle{ObjectMeta: metav1.ObjectMeta{Name: "alice-plain"},
			Spec: certificatesv1.ClusterTrustBundleSpec{TrustBundle: testCAPEM(t, "alice-plain")}}
		if _, err := alice.Create(ctx, plain, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = bundles.Delete(context.Background(), plain.Name, metav1.DeleteOptions{}) })
		bind("ctb-attester")
		proctest.WaitFor(t, "alice attesting", 30*time.Second, func() error {
			_, err := alice.Create(ctx, attested, metav1.CreateOptions{})
			return err
		})
		t.Cleanup(func() { _ = bundles.Delete(context.Background(), attested.Name, metav1.DeleteOptions{}) })

		// A node reads every bundle (kube's system:node role).
		node := impersonating(config, "system:node:n1", "system:nodes").CertificatesV1().ClusterTrustBundles()
		proctest.WaitFor(t, "a node listing bundles", 30*time.Second, func() error {
			_, err := node.List(ctx, metav1.ListOptions{})
			return err
		})
		if _, err := node.Get(ctx, signed.Name, metav1.GetOptions{}); err != nil {
			t.Error(err)
		}
		if err := node.Delete(ctx, signed.Name, metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("a node deleting a bundle: %v; want 403", err)
		}
	})

	t.Run("PodCertificateRequest", func(t *testing.T) {
		const ns, signer = "pcr", "example.com/pod-signer"
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cs.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
		sa, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "app"}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		nodes := map[string]*corev1.Node{}
		for _, name := range []string{"n1", "n2"} {
			n, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			nodes[name] = n
			t.Cleanup(func() { _ = cs.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
		}
		no := false
		pod := func(name, node string) *corev1.Pod {
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: corev1.PodSpec{
				NodeName: node, ServiceAccountName: "app", AutomountServiceAccountToken: &no,
				Containers: []corev1.Container{{Name: "c", Image: "busybox", VolumeMounts: []corev1.VolumeMount{{Name: "tls", MountPath: "/tls"}}}},
				Volumes: []corev1.Volume{{Name: "tls", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
					Sources: []corev1.VolumeProjection{{PodCertificate: &corev1.PodCertificateProjection{
						SignerName: signer, KeyType: "ECDSAP256", CredentialBundlePath: "creds.pem"}}}}}}}}}
			created, err := cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return created
		}
		// kube's pod validation of the projection.
		bad := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "bad", Namespace: ns}, Spec: corev1.PodSpec{
			ServiceAccountName: "app", AutomountServiceAccountToken: &no, Containers: []corev1.Container{{Name: "c", Image: "busybox"}},
			Volumes: []corev1.Volume{{Name: "tls", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{{PodCertificate: &corev1.PodCertificateProjection{
					SignerName: signer, KeyType: "ECDSAP256", CredentialBundlePath: "creds.pem", MaxExpirationSeconds: ptr(int32(3599))}}}}}}}}}
		_, err = cs.CoreV1().Pods(ns).Create(ctx, bad, metav1.CreateOptions{})
		wantInvalidField(t, err, "spec.volumes[0].projected.sources[0].podCertificate.maxExpirationSeconds")
		if err == nil || !strings.Contains(err.Error(), "if provided, maxExpirationSeconds must be >= 3600") {
			t.Errorf("%v; want kube's message", err)
		}

		p1, p2 := pod("p1", "n1"), pod("p2", "n2")
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		stub, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
		if err != nil {
			t.Fatal(err)
		}
		request := func(p *corev1.Pod, node *corev1.Node) *certificatesv1.PodCertificateRequest {
			return &certificatesv1.PodCertificateRequest{ObjectMeta: metav1.ObjectMeta{GenerateName: "req-", Namespace: ns},
				Spec: certificatesv1.PodCertificateRequestSpec{SignerName: signer, PodName: p.Name, PodUID: p.UID,
					ServiceAccountName: "app", ServiceAccountUID: sa.UID, NodeName: types.NodeName(node.Name), NodeUID: node.UID,
					StubPKCS10Request: stub}}
		}

		pcrs := certs.PodCertificateRequests(ns)
		invalid := request(p1, nodes["n1"])
		invalid.Spec.PodUID = ""
		_, err = pcrs.Create(ctx, invalid, metav1.CreateOptions{})
		wantInvalidField(t, err, "spec.podUID")
		created, err := pcrs.Create(ctx, request(p2, nodes["n2"]), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if created.Spec.MaxExpirationSeconds == nil || *created.Spec.MaxExpirationSeconds != 86400 {
			t.Errorf("maxExpirationSeconds %v; want kube's default of 86400", created.Spec.MaxExpirationSeconds)
		}
		list, err := pcrs.List(ctx, metav1.ListOptions{FieldSelector: "spec.podName=p2,spec.nodeName=n2,spec.signerName=" + signer})
		if err != nil || len(list.Items) != 1 {
			t.Fatalf("list by pod, node and signer: %+v, %v", list, err)
		}
		created.Spec.PodName = "p3"
		if _, err := pcrs.Update(ctx, created, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) {
			t.Errorf("changing the spec: %v; want 422", err)
		}

		// The status, only through /status and only by one who may sign for the signer.
		now := time.Now().Truncate(time.Second)
		got, err := pcrs.Get(ctx, created.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got.Status.Conditions = []metav1.Condition{{Type: certificatesv1.PodCertificateRequestConditionTypeDenied, Status: metav1.ConditionTrue,
			Reason: "NotToday", Message: "no", LastTransitionTime: metav1.NewTime(now)}}
		if updated, err := pcrs.Update(ctx, got, metav1.UpdateOptions{}); err != nil || len(updated.Status.Conditions) != 0 {
			t.Errorf("a status through the main resource: %+v, %v; want it dropped", updated, err)
		}
		role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "pcr-status-writer"}, Rules: []rbacv1.PolicyRule{
			{Verbs: []string{"get", "update"}, APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"podcertificaterequests/status"}}}}
		if _, err := cs.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cs.RbacV1().ClusterRoles().Delete(context.Background(), role.Name, metav1.DeleteOptions{}) })
		binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "pcr-status-writer-bob"},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role.Name},
			Subjects: []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: "bob"}}}
		if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cs.RbacV1().ClusterRoleBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
		})
		bob := impersonating(config, "bob").CertificatesV1().PodCertificateRequests(ns)
		proctest.WaitFor(t, "bob's role", 30*time.Second, func() error {
			_, err := bob.UpdateStatus(ctx, got, metav1.UpdateOptions{})
			if apierrors.IsInvalid(err) {
				return nil
			}
			return err
		})
		if _, err := bob.UpdateStatus(ctx, got, metav1.UpdateOptions{}); err == nil ||
			!strings.Contains(err.Error(), `User "bob" is not permitted to "sign" for signer "example.com/pod-signer"`) {
			t.Errorf("bob writing the status: %v; want 422 naming spec.signerName", err)
		} else {
			wantInvalidField(t, err, "spec.signerName")
		}
		denied, err := pcrs.UpdateStatus(ctx, got, metav1.UpdateOptions{})
		if err != nil || len(denied.Status.Conditions) != 1 {
			t.Fatalf("the status by system:masters: %+v, %v", denied, err)
		}

		// A node: the requests of its own pods, naming them as they are.
		asN1 := impersonating(config, "system:node:n1", "system:nodes").CertificatesV1().PodCertificateRequests(ns)
		var own *certificatesv1.PodCertificateRequest
		proctest.WaitFor(t, "node n1 creating a request for its pod", 30*time.Second, func() error {
			own, err = asN1.Create(ctx, request(p1, nodes["n1"]), metav1.CreateOptions{})
			return err
		})
		for _, tc := range []struct {
			name   string
			mutate func(*certificatesv1.PodCertificateRequest)
			want   func(error) bool
		}{
			{"a pod of another node", func(r *certificatesv1.PodCertificateRequest) { *r = *request(p2, nodes["n1"]) }, apierrors.IsForbidden},
			{"another node's name", func(r *certificatesv1.PodCertificateRequest) { *r = *request(p2, nodes["n2"]) }, apierrors.IsForbidden},
			{"a stale pod UID", func(r *certificatesv1.PodCertificateRequest) { r.Spec.PodUID = "0000" }, apierrors.IsInternalError},
			{"a stale node UID", func(r *certificatesv1.PodCertificateRequest) { r.Spec.NodeUID = "0000" }, apierrors.IsInternalError},
			{"another service account", func(r *certificatesv1.PodCertificateRequest) { r.Spec.ServiceAccountName = "default" }, apierrors.IsForbidden},
			{"a signer the pod does not mount", func(r *certificatesv1.PodCertificateRequest) { r.Spec.SignerName = "example.com/other" }, apierrors.IsForbidden},
		} {
			r := request(p1, nodes["n1"])
			tc.mutate(r)
			if _, err := asN1.Create(ctx, r, metav1.CreateOptions{}); !tc.want(err) {
				t.Errorf("node n1 creating a request for %s: %v", tc.name, err)
			}
		}
		proctest.WaitFor(t, "node n1 reading its request", 30*time.Second, func() error {
			_, err := asN1.Get(ctx, own.Name, metav1.GetOptions{})
			return err
		})
		if _, err := asN1.Get(ctx, created.Name, metav1.GetOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("node n1 reading a request of n2: %v; want 403", err)
		}
		if _, err := asN1.List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("node n1 listing every request: %v; want 403", err)
		}
		if list, err := asN1.List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=n1"}); err != nil || len(list.Items) != 1 {
			t.Errorf("node n1 listing its requests: %+v, %v", list, err)
		}
		if _, err := asN1.UpdateStatus(ctx, own, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("node n1 writing a status: %v; want 403", err)
		}
		for _, name := range []string{own.Name, created.Name} {
			if err := pcrs.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
				t.Error(err)
			}
		}
	})
}
