package e2e

import (
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/skiff-dev/skiff/internal/proctest"
)

const noForbiddenLabelPolicy = `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: no-forbidden-label}
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: [""]
      apiVersions: [v1]
      operations: [CREATE, UPDATE]
      resources: [configmaps]
  validations:
  - expression: "!has(object.metadata.labels) || !('forbidden' in object.metadata.labels)"
    message: "the label forbidden is not allowed"
  - expression: "!has(object.metadata.labels) || !('discouraged' in object.metadata.labels)"
    message: "the label discouraged is discouraged"
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: no-forbidden-label}
spec:
  policyName: no-forbidden-label
  validationActions: [Deny]
  matchResources:
    namespaceSelector:
      matchLabels: {policy-test: "on"}
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata: {name: no-forbidden-label-warn}
spec:
  policyName: no-forbidden-label
  validationActions: [Warn]
  matchResources:
    namespaceSelector:
      matchLabels: {policy-test: "warn"}
`

// TestValidatingAdmissionPolicy: a ValidatingAdmissionPolicy with CEL, bound with Deny in one namespace and
// with Warn in another, through the stock kubectl: what it forbids is refused with the library's message
// where Deny binds it, reaches kubectl as a Warning where Warn does, and passes where nothing binds it. A
// policy whose CEL does not compile is refused with its field path.
func TestValidatingAdmissionPolicy(t *testing.T) {
	parallel(t)
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Skip("kubectl not installed")
	}
	c := proctest.NewCluster(t, 1, "")
	p := c.Procs[0]
	c.Start(p)
	k := kubectl{t: t, kubeconfig: p.Kubeconfig()}
	k.waitForAPI("default")
	applyYAML(t, k, noForbiddenLabelPolicy)
	for ns, mode := range map[string]string{"denied": "on", "warned": "warn", "free": "off"} {
		k.ok("create", "namespace", ns)
		k.ok("label", "namespace", ns, "policy-test="+mode)
	}
	mustContain(t, "kubectl get validatingadmissionpolicies", k.ok("get", "validatingadmissionpolicies"), "no-forbidden-label")

	bad := `apiVersion: v1
kind: ConfigMap
metadata: {name: bad, labels: {forbidden: "yes"}}
`
	// The plugin learns of the policy through its informer: wait for the first refusal.
	var out string
	proctest.WaitFor(t, "the policy enforced", 30*time.Second, func() error {
		out = kubectlStdin(t, k, bad, "create", "-n", "denied", "-f", "-")
		if strings.Contains(out, "created") {
			k.ok("delete", "configmap", "bad", "-n", "denied")
			return fmt.Errorf("admitted: %s", out)
		}
		return nil
	})
	mustContain(t, "the Deny binding", out, `ValidatingAdmissionPolicy 'no-forbidden-label' with binding 'no-forbidden-label' denied request: the label forbidden is not allowed`)
	k.ok("create", "configmap", "good", "-n", "denied")
	out = kubectlStdin(t, k, bad, "create", "-n", "warned", "-f", "-")
	mustContain(t, "the Warn binding", out, `Warning: Validation failed for ValidatingAdmissionPolicy 'no-forbidden-label' with binding 'no-forbidden-label-warn': the label forbidden is not allowed`)
	mustContain(t, "the Warn binding", out, "configmap/bad created")
	out = kubectlStdin(t, k, bad, "create", "-n", "free", "-f", "-")
	mustContain(t, "no binding", out, "configmap/bad created")
	if strings.Contains(out, "Warning") {
		t.Fatalf("a warning where no binding matches:\n%s", out)
	}

	out = kubectlStdin(t, k, `apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata: {name: broken}
spec:
  matchConstraints:
    resourceRules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [configmaps]}]
  validations:
  - expression: "object.metadata.labels.all("
`, "create", "-f", "-")
	mustContain(t, "a policy that does not compile", out, `spec.validations[0].expression: Invalid value`)
}

// kubectlStdin runs kubectl with doc on its standard input and returns its combined output, whatever its
// exit status.
func kubectlStdin(t *testing.T, k kubectl, doc string, args ...string) string {
	t.Helper()
	cmd := exec.Command("kubectl", append([]string{"--kubeconfig", k.kubeconfig}, args...)...)
	cmd.Stdin = strings.NewReader(doc)
	out, _ := cmd.CombinedOutput()
	return string(out)
}

// TestLimitRangeQuotaPodSecurityWithKubectl is issue 19's admission acceptance through the stock kubectl:
//   - LimitRange defaults appear on a pod that set no resources, and a pod over the max is refused with
//     Kubernetes' message;
//   - `kubectl describe quota` shows used/hard after creates and deletes; the create beyond the quota is
//     refused; a create that fails after admission charged the quota (a name taken) leaves no charge once
//     the controller's resync ran;
//   - PodSecurity: a privileged pod in a restricted namespace is refused with the library's message, a
//     Deployment with one gets a warning, and baseline admits what it should.
func TestLimitRangeQuotaPodSecurityWithKubectl(t *testing.T) {
	parallel(t)
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Skip("kubectl not installed")
	}
	c := proctest.NewCluster(t, 1, `resource_quota_sync_period = "3s"`)
	p := c.Procs[0]
	c.Start(p)
	k := kubectl{t: t, kubeconfig: p.Kubeconfig()}
	k.waitForAPI("default")

	// LimitRanger.
	k.ok("create", "namespace", "limits")
	applyYAML(t, k, `apiVersion: v1
kind: LimitRange
metadata: {name: defaults, namespace: limits}
spec:
  limits:
  - type: Container
    default: {cpu: 200m, memory: 64Mi}
    defaultRequest: {cpu: 100m, memory: 32Mi}
    max: {cpu: "1"}
`)
	k.ok("run", "defaulted", "-n", "limits", "--image=busybox", "--overrides", `{"spec":{"schedulerName":"none"}}`)
	got := k.ok("get", "pod", "defaulted", "-n", "limits", "-o", "jsonpath={.spec.containers[0].resources}")
	for _, want := range []string{`"limits":{"cpu":"200m","memory":"64Mi"}`, `"requests":{"cpu":"100m","memory":"32Mi"}`} {
		mustContain(t, "the LimitRange's defaults", got, want)
	}
	out := kubectlStdin(t, k, `apiVersion: v1
kind: Pod
metadata: {name: big, namespace: limits}
spec:
  schedulerName: none
  containers: [{name: c, image: busybox, resources: {limits: {cpu: "2"}}}]
`, "create", "-f", "-")
	mustContain(t, "a pod over the max", out, `pods "big" is forbidden: maximum cpu usage per Container is 1, but limit is 2`) // as kube-apiserver words it: the limit, the first bound it breaks

	// ResourceQuota.
	k.ok("create", "namespace", "quota")
	k.ok("create", "quota", "q", "-n", "quota", "--hard=pods=2,requests.cpu=1")
	usedIs := func(want string) {
		t.Helper()
		proctest.WaitFor(t, "the quota's usage "+want, 30*time.Second, func() error {
			out := k.ok("describe", "quota", "q", "-n", "quota")
			if !regexp.MustCompile(`pods\s+` + want + `\s+2\b`).MatchString(out) {
				return fmt.Errorf("describe quota:\n%s", out)
			}
			return nil
		})
	}
	usedIs("0")
	pod := func(name string) string {
		return fmt.Sprintf("apiVersion: v1\nkind: Pod\nmetadata: {name: %s, namespace: quota}\nspec:\n  schedulerName: none\n  containers: [{name: c, image: busybox, resources: {requests: {cpu: 100m}}}]\n", name)
	}
	for _, name := range []string{"q1", "q2"} {
		mustContain(t, "a create within the quota", kubectlStdin(t, k, pod(name), "create", "-f", "-"), "created")
	}
	usedIs("2")
	mustContain(t, "the create beyond the quota", kubectlStdin(t, k, pod("q3"), "create", "-f", "-"),
		`pods "q3" is forbidden: exceeded quota: q, requested: pods=1, used: pods=2, limited: pods=2`)
	k.ok("delete", "pod", "q2", "-n", "quota", "--grace-period=0", "--force")
	usedIs("1")
	// A name that is taken: admission charges the quota, then the store refuses the create.
	mustContain(t, "a create that fails after admission", kubectlStdin(t, k, pod("q1"), "create", "-f", "-"), "AlreadyExists")
	usedIs("1")
	mustContain(t, "a create after the failed one", kubectlStdin(t, k, pod("q4"), "create", "-f", "-"), "created")

	// PodSecurity.
	k.ok("create", "namespace", "restricted")
	k.ok("label", "namespace", "restricted", "pod-security.kubernetes.io/enforce=restricted", "pod-security.kubernetes.io/warn=restricted")
	privileged := func(ns string) string {
		return fmt.Sprintf("apiVersion: v1\nkind: Pod\nmetadata: {name: priv, namespace: %s}\nspec:\n  schedulerName: none\n  containers: [{name: c, image: busybox, securityContext: {privileged: true}}]\n", ns)
	}
	mustContain(t, "a privileged pod in a restricted namespace", kubectlStdin(t, k, privileged("restricted"), "create", "-f", "-"),
		`pods "priv" is forbidden: violates PodSecurity "restricted:latest": privileged (container "c" must not set securityContext.privileged=true)`)
	out = kubectlStdin(t, k, `apiVersion: apps/v1
kind: Deployment
metadata: {name: priv, namespace: restricted}
spec:
  selector: {matchLabels: {app: priv}}
  template:
    metadata: {labels: {app: priv}}
    spec:
      schedulerName: none
      containers: [{name: c, image: busybox, securityContext: {privileged: true}}]
`, "create", "-f", "-")
	mustContain(t, "a Deployment with a privileged pod", out, `Warning: would violate PodSecurity "restricted:latest": privileged`)
	mustContain(t, "a Deployment with a privileged pod", out, "deployment.apps/priv created")
	k.ok("create", "namespace", "baseline")
	k.ok("label", "namespace", "baseline", "pod-security.kubernetes.io/enforce=baseline")
	mustContain(t, "baseline refusing a privileged pod", kubectlStdin(t, k, privileged("baseline"), "create", "-f", "-"), `violates PodSecurity "baseline:latest"`)
	out = kubectlStdin(t, k, "apiVersion: v1\nkind: Pod\nmetadata: {name: plain, namespace: baseline}\nspec:\n  schedulerName: none\n  containers: [{name: c, image: busybox}]\n", "create", "-f", "-")
	mustContain(t, "baseline admitting a plain pod", out, "pod/plain created")
}
