package admission

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// testServiceAccountAdmission is the plugin over a fake clientset whose informer holds the accounts given;
// the live lookups go to the clientset, which holds live. It names token volumes kube-api-access-abcde.
func testServiceAccountAdmission(t *testing.T, cached []*corev1.ServiceAccount, live ...runtime.Object) (*serviceAccountAdmission, *fake.Clientset) {
	t.Helper()
	client := fake.NewClientset(live...)
	factory := informers.NewSharedInformerFactory(client, 0)
	p := newServiceAccountAdmission(client, factory)
	for _, sa := range cached {
		if err := factory.Core().V1().ServiceAccounts().Informer().GetIndexer().Add(sa); err != nil {
			t.Fatal(err)
		}
	}
	p.generateName = func(base string) string { return base + "abcde" }
	p.retryInterval = func() time.Duration { return time.Millisecond }
	client.ClearActions()
	return p, client
}

func account(name string, automount *bool, pullSecrets ...string) *corev1.ServiceAccount {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name}, AutomountServiceAccountToken: automount}
	for _, s := range pullSecrets {
		sa.ImagePullSecrets = append(sa.ImagePullSecrets, corev1.LocalObjectReference{Name: s})
	}
	return sa
}

func podAttrs(pod *corev1.Pod, old *corev1.Pod, op admission.Operation, subresource string) admission.Attributes {
	var opts runtime.Object = &metav1.CreateOptions{}
	if op == admission.Update {
		opts = &metav1.UpdateOptions{}
	}
	return admission.NewAttributesRecord(pod, old, corev1.SchemeGroupVersion.WithKind("Pod"), pod.Namespace, pod.Name,
		corev1.Resource("pods").WithVersion("v1"), subresource, op, opts, false, nil)
}

// samplePod has an init container, two containers and an ephemeral one.
func samplePod() *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "p"}, Spec: corev1.PodSpec{
		InitContainers:      []corev1.Container{{Name: "init", Image: "busybox"}},
		Containers:          []corev1.Container{{Name: "a", Image: "busybox"}, {Name: "b", Image: "busybox"}},
		EphemeralContainers: []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug", Image: "busybox"}}},
	}}
}

var tokenMount = corev1.VolumeMount{Name: "kube-api-access-abcde", ReadOnly: true, MountPath: "/var/run/secrets/kubernetes.io/serviceaccount"}

// mountsByContainer lists the volume mounts of each container, ephemeral ones included, by name.
func mountsByContainer(pod *corev1.Pod) map[string][]corev1.VolumeMount {
	m := map[string][]corev1.VolumeMount{}
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range list {
			m[c.Name] = c.VolumeMounts
		}
	}
	for _, c := range pod.Spec.EphemeralContainers {
		m[c.Name] = c.VolumeMounts
	}
	return m
}

func TestServiceAccountAdmissionMountsToken(t *testing.T) {
	yes, no := new(true), new(false)
	own := corev1.VolumeMount{Name: "mine", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount"}
	mineVolume := corev1.Volume{Name: "mine", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}
	cases := []struct {
		name      string
		sa        *corev1.ServiceAccount
		change    func(*corev1.Pod)
		wantSA    string
		mounted   bool                            // the token volume is added and mounted in init, a and b
		added     bool                            // the token volume is added, mounted as wantMount says
		wantMount map[string][]corev1.VolumeMount // the mounts expected unless mounted
		wantPull  []string
	}{
		{name: "default account", sa: account("default", nil), wantSA: "default", mounted: true},
		{name: "named account", sa: account("robot", nil), change: func(p *corev1.Pod) { p.Spec.ServiceAccountName = "robot" }, wantSA: "robot", mounted: true},
		{name: "deprecated alias names the account", sa: account("robot", nil),
			change: func(p *corev1.Pod) { p.Spec.DeprecatedServiceAccount = "robot" }, wantSA: "robot", mounted: true},
		{name: "pod opts out", sa: account("default", nil), change: func(p *corev1.Pod) { p.Spec.AutomountServiceAccountToken = no },
			wantSA: "default", wantMount: map[string][]corev1.VolumeMount{"init": nil, "a": nil, "b": nil, "debug": nil}},
		{name: "account opts out", sa: account("default", no), wantSA: "default",
			wantMount: map[string][]corev1.VolumeMount{"init": nil, "a": nil, "b": nil, "debug": nil}},
		{name: "pod opts in over its account", sa: account("default", no), change: func(p *corev1.Pod) { p.Spec.AutomountServiceAccountToken = yes },
			wantSA: "default", mounted: true},
		{name: "a container with its own mount there keeps it", sa: account("default", nil), change: func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{mineVolume}
			p.Spec.Containers[1].VolumeMounts = []corev1.VolumeMount{own}
		}, wantSA: "default", added: true, wantMount: map[string][]corev1.VolumeMount{"init": {tokenMount}, "a": {tokenMount}, "b": {own}, "debug": nil}},
		{name: "every container with its own mount: no volume", sa: account("default", nil), change: func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{mineVolume}
			for _, list := range [][]corev1.Container{p.Spec.InitContainers, p.Spec.Containers} {
				for i := range list {
					list[i].VolumeMounts = []corev1.VolumeMount{own}
				}
			}
		}, wantSA: "default", wantMount: map[string][]corev1.VolumeMount{"init": {own}, "a": {own}, "b": {own}, "debug": nil}},
		{name: "a kube-api-access volume of the pod's own is used", sa: account("default", nil), change: func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: "kube-api-access-mine", VolumeSource: corev1.VolumeSource{Projected: tokenVolumeSource()}}}
		}, wantSA: "default", wantMount: func() map[string][]corev1.VolumeMount {
			m := tokenMount
			m.Name = "kube-api-access-mine"
			return map[string][]corev1.VolumeMount{"init": {m}, "a": {m}, "b": {m}, "debug": nil}
		}()},
		{name: "the account's pull secrets", sa: account("default", nil, "reg1", "reg2"), wantSA: "default", mounted: true, wantPull: []string{"reg1", "reg2"}},
		{name: "the pod's own pull secrets win", sa: account("default", nil, "reg1"), change: func(p *corev1.Pod) {
			p.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "mine"}}
		}, wantSA: "default", mounted: true, wantPull: []string{"mine"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, client := testServiceAccountAdmission(t, []*corev1.ServiceAccount{tc.sa})
			pod := samplePod()
			if tc.change != nil {
				tc.change(pod)
			}
			volumesBefore := len(pod.Spec.Volumes)
			if err := p.Admit(context.Background(), podAttrs(pod, nil, admission.Create, ""), nil); err != nil {
				t.Fatalf("Admit: %v", err)
			}
			if pod.Spec.ServiceAccountName != tc.wantSA || pod.Spec.DeprecatedServiceAccount != tc.wantSA { //nolint:staticcheck // the v1 alias
				t.Errorf("serviceAccountName %q, serviceAccount %q, want %q", pod.Spec.ServiceAccountName, pod.Spec.DeprecatedServiceAccount, tc.wantSA) //nolint:staticcheck // the v1 alias
			}
			want := tc.wantMount
			if tc.mounted {
				want = map[string][]corev1.VolumeMount{"init": {tokenMount}, "a": {tokenMount}, "b": {tokenMount}, "debug": nil}
			}
			if tc.mounted || tc.added {
				if len(pod.Spec.Volumes) != volumesBefore+1 {
					t.Fatalf("volumes %v, want one added", pod.Spec.Volumes)
				}
				v := pod.Spec.Volumes[len(pod.Spec.Volumes)-1]
				if v.Name != "kube-api-access-abcde" || !apiequality.Semantic.DeepEqual(v.VolumeSource, corev1.VolumeSource{Projected: tokenVolumeSource()}) {
					t.Errorf("token volume %+v", v)
				}
			} else if len(pod.Spec.Volumes) != volumesBefore {
				t.Errorf("volumes %v, want none added", pod.Spec.Volumes)
			}
			if got := mountsByContainer(pod); !apiequality.Semantic.DeepEqual(got, want) {
				t.Errorf("mounts %v, want %v", got, want)
			}
			var pull []string
			for _, ref := range pod.Spec.ImagePullSecrets {
				pull = append(pull, ref.Name)
			}
			if strings.Join(pull, ",") != strings.Join(tc.wantPull, ",") {
				t.Errorf("imagePullSecrets %v, want %v", pull, tc.wantPull)
			}
			if n := len(client.Actions()); n != 0 {
				t.Errorf("%d live lookups of an account the informer holds", n)
			}
		})
	}
}

// TestTokenVolumeSource pins the volume to Kubernetes' own: the API server's clients and the kubelet expect
// exactly these paths.
func TestTokenVolumeSource(t *testing.T) {
	v := tokenVolumeSource()
	if v.DefaultMode == nil || *v.DefaultMode != 420 || len(v.Sources) != 3 {
		t.Fatalf("volume %+v", v)
	}
	tok, cm, ns := v.Sources[0].ServiceAccountToken, v.Sources[1].ConfigMap, v.Sources[2].DownwardAPI
	if tok == nil || tok.Path != "token" || tok.Audience != "" || tok.ExpirationSeconds == nil || *tok.ExpirationSeconds != 3607 {
		t.Errorf("token source %+v", tok)
	}
	if cm == nil || cm.Name != "kube-root-ca.crt" || len(cm.Items) != 1 || cm.Items[0].Key != "ca.crt" || cm.Items[0].Path != "ca.crt" {
		t.Errorf("CA source %+v", cm)
	}
	if ns == nil || len(ns.Items) != 1 || ns.Items[0].Path != "namespace" || ns.Items[0].FieldRef == nil || ns.Items[0].FieldRef.FieldPath != "metadata.namespace" {
		t.Errorf("namespace source %+v", ns)
	}
}

func TestServiceAccountAdmissionLookups(t *testing.T) {
	t.Run("a missing account is refused with Kubernetes' message", func(t *testing.T) {
		p, client := testServiceAccountAdmission(t, nil)
		pod := samplePod()
		pod.Spec.ServiceAccountName = "ghost"
		err := p.Admit(context.Background(), podAttrs(pod, nil, admission.Create, ""), nil)
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `pods "p" is forbidden: error looking up service account team/ghost: serviceaccount "ghost" not found`) {
			t.Fatalf("Admit: %v", err)
		}
		if n := len(client.Actions()); n != 1 {
			t.Errorf("%d live lookups of a named account, want 1", n)
		}
	})
	t.Run("an account the informer has not seen yet is found live", func(t *testing.T) {
		p, client := testServiceAccountAdmission(t, nil, account("robot", nil))
		pod := samplePod()
		pod.Spec.ServiceAccountName = "robot"
		if err := p.Admit(context.Background(), podAttrs(pod, nil, admission.Create, ""), nil); err != nil {
			t.Fatalf("Admit: %v", err)
		}
		if n := len(client.Actions()); n != 1 {
			t.Errorf("%d live lookups, want 1", n)
		}
	})
	t.Run("default is waited for while the controller creates it", func(t *testing.T) {
		p, client := testServiceAccountAdmission(t, nil)
		gets := 0
		client.PrependReactor("get", "serviceaccounts", func(k8stesting.Action) (bool, runtime.Object, error) {
			if gets++; gets < 4 {
				return true, nil, apierrors.NewNotFound(corev1.Resource("serviceaccounts"), "default")
			}
			return true, account("default", nil), nil
		})
		pod := samplePod()
		if err := p.Admit(context.Background(), podAttrs(pod, nil, admission.Create, ""), nil); err != nil {
			t.Fatalf("Admit: %v", err)
		}
		if gets != 4 || len(pod.Spec.Volumes) != 1 {
			t.Errorf("%d lookups, volumes %v; want 4 and the token volume", gets, pod.Spec.Volumes)
		}
	})
	t.Run("default that never comes is refused after ten tries", func(t *testing.T) {
		p, client := testServiceAccountAdmission(t, nil)
		err := p.Admit(context.Background(), podAttrs(samplePod(), nil, admission.Create, ""), nil)
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `error looking up service account team/default: serviceaccount "default" not found`) {
			t.Fatalf("Admit: %v", err)
		}
		if n := len(client.Actions()); n != 10 {
			t.Errorf("%d live lookups of default, want 10", n)
		}
	})
}

func TestServiceAccountAdmissionMirrorPods(t *testing.T) {
	mirror := func(change func(*corev1.Pod)) *corev1.Pod {
		pod := samplePod()
		pod.Spec.EphemeralContainers = nil
		pod.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: "x"}
		if change != nil {
			change(pod)
		}
		return pod
	}
	cases := []struct {
		name    string
		pod     *corev1.Pod
		wantErr string
	}{
		{"left alone", mirror(nil), ""},
		{"service account", mirror(func(p *corev1.Pod) { p.Spec.ServiceAccountName = "default" }), "a mirror pod may not reference service accounts"},
		{"secret env", mirror(func(p *corev1.Pod) {
			p.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "s"}}}}
		}), "a mirror pod may not reference secrets"},
		{"token projection", mirror(func(p *corev1.Pod) {
			p.Spec.Volumes = []corev1.Volume{{Name: "t", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}}}}}}}
		}), "a mirror pod may not use ServiceAccountToken volume projections"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, client := testServiceAccountAdmission(t, nil)
			before := tc.pod.DeepCopy()
			err := p.Admit(context.Background(), podAttrs(tc.pod, nil, admission.Create, ""), nil)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (!apierrors.IsForbidden(err) || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("Admit: %v, want %q", err, tc.wantErr)
			}
			if !apiequality.Semantic.DeepEqual(before, tc.pod) {
				t.Errorf("a mirror pod was changed")
			}
			if n := len(client.Actions()); n != 0 {
				t.Errorf("%d lookups for a mirror pod", n)
			}
		})
	}
}

func TestServiceAccountAdmissionUpdates(t *testing.T) {
	p, _ := testServiceAccountAdmission(t, []*corev1.ServiceAccount{account("default", nil)})
	old := samplePod()
	old.Spec.ServiceAccountName = "default"
	// A plain update is not changed: the spec is immutable, and pod validation says so (package apiserver's
	// TestPodServiceAccountNameImmutable).
	pod := old.DeepCopy()
	pod.Spec.ServiceAccountName = "robot"
	if err := p.Admit(context.Background(), podAttrs(pod, old, admission.Update, ""), nil); err != nil {
		t.Fatal(err)
	}
	if err := p.Validate(context.Background(), podAttrs(pod, old, admission.Update, ""), nil); err != nil {
		t.Fatal(err)
	}
	if len(pod.Spec.Volumes) != 0 || pod.Spec.ServiceAccountName != "robot" {
		t.Errorf("an update was changed: %+v", pod.Spec)
	}
	// Ephemeral containers need the pod's account.
	if err := p.Validate(context.Background(), podAttrs(old, old, admission.Update, "ephemeralcontainers"), nil); err != nil {
		t.Errorf("ephemeral containers with the account present: %v", err)
	}
	gone := old.DeepCopy()
	gone.Spec.ServiceAccountName = "ghost"
	if err := p.Validate(context.Background(), podAttrs(gone, gone, admission.Update, "ephemeralcontainers"), nil); !apierrors.IsForbidden(err) ||
		!strings.Contains(err.Error(), "error looking up service account team/ghost") {
		t.Errorf("ephemeral containers with the account gone: %v", err)
	}
	// Other resources and subresources are not its business.
	sa := account("x", nil)
	attrs := admission.NewAttributesRecord(sa, nil, corev1.SchemeGroupVersion.WithKind("ServiceAccount"), "team", "x",
		corev1.Resource("serviceaccounts").WithVersion("v1"), "", admission.Create, &metav1.CreateOptions{}, false, nil)
	if err := p.Admit(context.Background(), attrs, nil); err != nil {
		t.Errorf("a ServiceAccount create: %v", err)
	}
	status := samplePod()
	status.Spec.ServiceAccountName = "ghost"
	if err := p.Validate(context.Background(), podAttrs(status, status, admission.Update, "status"), nil); err != nil {
		t.Errorf("a status update: %v", err)
	}
}
