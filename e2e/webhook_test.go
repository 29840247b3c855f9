package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/internal/proctest"
	"github.com/skiff-dev/skiff/internal/testimages"
)

const webhookServerYAML = `apiVersion: apps/v1
kind: Deployment
metadata: {name: webhook, namespace: webhook-system}
spec:
  replicas: 1
  selector: {matchLabels: {app: webhook}}
  template:
    metadata: {labels: {app: webhook}}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
      - name: server
        image: %s
        args: ["-webhook-cert", "/certs/tls.crt", "-webhook-key", "/certs/tls.key", "-webhook-port", "8443"]
        readinessProbe:
          httpGet: {path: /ready, port: 8080}
          periodSeconds: 1
        volumeMounts: [{name: certs, mountPath: /certs, readOnly: true}]
      volumes:
      - name: certs
        secret: {secretName: webhook-tls}
---
apiVersion: v1
kind: Service
metadata: {name: webhook, namespace: webhook-system}
spec:
  selector: {app: webhook}
  ports: [{port: 443, targetPort: 8443}]
`

const webhookConfigsYAML = `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: webhook-test}
webhooks:
- name: validate.webhook-test.skiff.dev
  clientConfig:
    service: {namespace: webhook-system, name: webhook, path: /validate, port: 443}
    caBundle: %[1]s
  rules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE, UPDATE], resources: [configmaps]}]
  namespaceSelector: {matchLabels: {webhook-test: "on"}}
  failurePolicy: Fail
  sideEffects: None
  admissionReviewVersions: [v1]
  timeoutSeconds: 5
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: webhook-test}
webhooks:
- name: mutate.webhook-test.skiff.dev
  clientConfig:
    service: {namespace: webhook-system, name: webhook, path: /mutate, port: 443}
    caBundle: %[1]s
  rules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [configmaps]}]
  namespaceSelector: {matchLabels: {webhook-test: "on"}}
  objectSelector: {matchExpressions: [{key: skip-mutation, operator: DoesNotExist}]}
  failurePolicy: Fail
  sideEffects: None
  admissionReviewVersions: [v1]
  timeoutSeconds: 5
`

// TestAdmissionWebhooks: a validating and a mutating admission webhook served by a pod on a real agent,
// reached by the servers through the webhook Service's endpoints over TLS verified with the configuration's
// caBundle. The validating webhook refuses what it should with its message; the mutating one labels what it
// admits, but not what its objectSelector leaves out, nor outside its namespaceSelector; a server-side dry
// run passes (sideEffects: None). With the webhook pod gone, failurePolicy Fail refuses with a clear message
// and Ignore admits.
func TestAdmissionWebhooks(t *testing.T) {
	parallelOnHostNetwork(t)
	requireRealRuntime(t)
	registry := testimages.StartRegistry(t)
	images := testimages.Push(t, registry)
	c := proctest.NewCluster(t, 1, fmt.Sprintf("token = %q", joinToken))
	c.Start(c.Procs[0])
	k := kubectl{t: t, kubeconfig: c.Procs[0].Kubeconfig()}
	k.waitForAPI("default")
	agent := newRealAgent(t, apiAddr(t, c.Procs[0].Kubeconfig()), registry)
	agent.start()
	waitNodeReady(t, k, agent.name)

	caPEM, certPEM, keyPEM := webhookCertificates(t, "webhook.webhook-system.svc")
	dir := t.TempDir()
	for name, body := range map[string][]byte{"tls.crt": certPEM, "tls.key": keyPEM} {
		if err := os.WriteFile(filepath.Join(dir, name), body, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	k.ok("create", "namespace", "webhook-system")
	k.ok("create", "secret", "tls", "webhook-tls", "-n", "webhook-system", "--cert="+filepath.Join(dir, "tls.crt"), "--key="+filepath.Join(dir, "tls.key"))
	applyYAML(t, k, fmt.Sprintf(webhookServerYAML, images.Server))
	proctest.WaitFor(t, "the webhook pod ready", 120*time.Second, func() error {
		out, err := k.run("get", "pods", "-n", "webhook-system", "-l", "app=webhook", "-o", "jsonpath={.items[*].status.containerStatuses[*].ready}")
		if err != nil || out != "true" {
			return fmt.Errorf("ready: %q %v", out, err)
		}
		return nil
	})
	for ns, label := range map[string]string{"hooked": "on", "unhooked": "off"} {
		k.ok("create", "namespace", ns)
		k.ok("label", "namespace", ns, "webhook-test="+label)
	}
	applyYAML(t, k, fmt.Sprintf(webhookConfigsYAML, base64.StdEncoding.EncodeToString(caPEM)))

	denied := "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: denied, labels: {webhook-test: deny}}\n"
	var out string
	proctest.WaitFor(t, "the validating webhook enforced", 30*time.Second, func() error {
		out = kubectlStdin(t, k, denied, "create", "-n", "hooked", "-f", "-")
		if strings.Contains(out, "created") {
			k.ok("delete", "configmap", "denied", "-n", "hooked")
			return fmt.Errorf("admitted: %s", out)
		}
		return nil
	})
	mustContain(t, "the validating webhook's refusal", out, `admission webhook "validate.webhook-test.skiff.dev" denied the request: the test webhook refuses objects labelled webhook-test=deny`)
	k.ok("create", "configmap", "plain", "-n", "hooked")
	if got := k.ok("get", "configmap", "plain", "-n", "hooked", "-o", "jsonpath={.metadata.labels.webhook-test-mutated}"); got != "true" {
		t.Fatalf("the mutating webhook did not label the ConfigMap: %q", got)
	}
	out = kubectlStdin(t, k, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: skipped, labels: {skip-mutation: \"yes\"}}\n", "create", "-n", "hooked", "-f", "-")
	mustContain(t, "a ConfigMap the objectSelector leaves out", out, "created")
	if got := k.ok("get", "configmap", "skipped", "-n", "hooked", "-o", "jsonpath={.metadata.labels}"); strings.Contains(got, "webhook-test-mutated") {
		t.Fatalf("the mutating webhook labelled what its objectSelector leaves out: %s", got)
	}
	out = kubectlStdin(t, k, denied, "create", "-n", "unhooked", "-f", "-")
	mustContain(t, "outside the namespaceSelector", out, "created")
	k.ok("create", "configmap", "dry", "-n", "hooked", "--dry-run=server")

	// The webhook pod gone: Fail refuses, clearly; Ignore admits, unmutated.
	k.ok("scale", "deployment", "webhook", "-n", "webhook-system", "--replicas=0")
	proctest.WaitFor(t, "the webhook pod gone", 60*time.Second, func() error {
		if out := k.ok("get", "pods", "-n", "webhook-system", "-o", "name"); out != "" {
			return fmt.Errorf("still: %s", out)
		}
		return nil
	})
	proctest.WaitFor(t, "failurePolicy Fail refusing", 30*time.Second, func() error {
		out = kubectlStdin(t, k, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: while-down}\n", "create", "-n", "hooked", "-f", "-")
		if strings.Contains(out, "created") {
			k.ok("delete", "configmap", "while-down", "-n", "hooked")
			return fmt.Errorf("admitted: %s", out)
		}
		return nil
	})
	mustContain(t, "failurePolicy Fail with the webhook down", out, `failed calling webhook "mutate.webhook-test.skiff.dev"`)
	for _, kind := range []string{"validatingwebhookconfiguration", "mutatingwebhookconfiguration"} {
		k.ok("patch", kind, "webhook-test", "--type=json", `-p=[{"op":"replace","path":"/webhooks/0/failurePolicy","value":"Ignore"}]`)
	}
	proctest.WaitFor(t, "failurePolicy Ignore admitting", 30*time.Second, func() error {
		out = kubectlStdin(t, k, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: while-down}\n", "create", "-n", "hooked", "-f", "-")
		if !strings.Contains(out, "created") {
			return fmt.Errorf("refused: %s", out)
		}
		return nil
	})
	if got := k.ok("get", "configmap", "while-down", "-n", "hooked", "-o", "jsonpath={.metadata.labels}"); strings.Contains(got, "webhook-test-mutated") {
		t.Fatalf("labelled with the webhook down: %s", got)
	}
}

// webhookCertificates draws a CA and a serving certificate for dnsName signed by it, in PEM.
func webhookCertificates(t *testing.T, dnsName string) (caPEM, certPEM, keyPEM []byte) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "webhook-test-ca"}, NotBefore: now.Add(-time.Hour),
		NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: dnsName}, DNSNames: []string{dnsName},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}
