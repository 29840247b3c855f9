package apiserver_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/skiff-dev/skiff/config"
	"github.com/skiff-dev/skiff/internal/servertest"
)

// warnings records the Warning headers a client receives.
type warnings struct {
	mu   sync.Mutex
	list []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list = append(w.list, text)
}

func (w *warnings) take() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := strings.Join(w.list, "\n")
	w.list = nil
	return out
}

// TestPodSecurity: Kubernetes' Pod Security admission by namespace labels: enforce refuses a privileged pod
// with Kubernetes' message, allows a restricted one; warn warns on pods and on Deployments; labelling a
// namespace warns about its existing pods; the server's defaults apply to unlabelled namespaces, and an
// exempt namespace is let be.
func TestPodSecurity(t *testing.T) {
	t.Parallel()
	peer := servertest.StartWith(t, 1, func(f *config.ServerFile) {
		baseline := "baseline"
		f.Server.PodSecurity = &config.PodSecurityBlock{Enforce: &baseline, ExemptNamespaces: []string{"exempt"}}
	})[0]
	ctx := context.Background()
	warned := &warnings{}
	cfg := rest.CopyConfig(peer.Config)
	cfg.WarningHandler = warned
	c := kubernetes.NewForConfigOrDie(cfg)
	ns := func(name string, labels map[string]string) {
		t.Helper()
		if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ns("locked", map[string]string{"pod-security.kubernetes.io/enforce": "restricted"})
	ns("warned", map[string]string{"pod-security.kubernetes.io/warn": "restricted", "pod-security.kubernetes.io/enforce": "privileged"})
	ns("plain", nil)
	ns("exempt", nil)
	yes, no, uid := true, false, int64(1000)
	privileged := func(name string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name: "c", Image: "busybox", SecurityContext: &corev1.SecurityContext{Privileged: &yes}}}}}
	}
	restricted := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "good"}, Spec: corev1.PodSpec{
		SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: &yes, RunAsUser: &uid, SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
		Containers: []corev1.Container{{Name: "c", Image: "busybox", SecurityContext: &corev1.SecurityContext{
			AllowPrivilegeEscalation: &no, Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}}}}}

	_, err := c.CoreV1().Pods("locked").Create(ctx, privileged("bad"), metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `violates PodSecurity "restricted:latest": privileged (container "c" must not set securityContext.privileged=true)`) {
		t.Fatalf("privileged pod in an enforce=restricted namespace: %v", err)
	}
	if _, err := c.CoreV1().Pods("locked").Create(ctx, restricted, metav1.CreateOptions{}); err != nil {
		t.Fatalf("restricted pod in an enforce=restricted namespace: %v", err)
	}
	warned.take()
	if _, err := c.CoreV1().Pods("warned").Create(ctx, privileged("loud"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if w := warned.take(); !strings.Contains(w, `would violate PodSecurity "restricted:latest"`) {
		t.Fatalf("warnings for a privileged pod in a warn=restricted namespace: %q", w)
	}
	// A Deployment whose pods would break the warn level is warned about, and created.
	labels := map[string]string{"app": "d"}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "d"}, Spec: appsv1.DeploymentSpec{
		Selector: &metav1.LabelSelector{MatchLabels: labels},
		Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels}, Spec: privileged("x").Spec}}}
	if _, err := c.AppsV1().Deployments("warned").Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if w := warned.take(); !strings.Contains(w, `would violate PodSecurity "restricted:latest"`) {
		t.Fatalf("warnings for a privileged Deployment in a warn=restricted namespace: %q", w)
	}
	// The server's default (enforce baseline) holds where there are no labels, but not in an exempt namespace.
	if _, err := c.CoreV1().Pods("plain").Create(ctx, privileged("bad"), metav1.CreateOptions{}); !apierrors.IsForbidden(err) ||
		!strings.Contains(err.Error(), `violates PodSecurity "baseline:latest"`) {
		t.Fatalf("privileged pod under the server's baseline default: %v", err)
	}
	if _, err := c.CoreV1().Pods("exempt").Create(ctx, privileged("ok"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("privileged pod in an exempt namespace: %v", err)
	}
	// Labelling a namespace warns about the pods already there that break the new level.
	nsObj, err := c.CoreV1().Namespaces().Get(ctx, "warned", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	nsObj.Labels["pod-security.kubernetes.io/enforce"] = "baseline"
	if _, err := c.CoreV1().Namespaces().Update(ctx, nsObj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if w := warned.take(); !strings.Contains(w, `existing pods in namespace "warned" violate the new PodSecurity enforce level "baseline:latest"`) {
		t.Fatalf("warnings when enforcing baseline over a privileged pod: %q", w)
	}
}
