package admission

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/apiserver/pkg/storage/names"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
)

// The names Kubernetes gives a pod's service account and its API credentials.
const (
	defaultServiceAccountName = "default"
	// serviceAccountVolumePrefix starts the name of the projected volume that holds a pod's API credentials.
	serviceAccountVolumePrefix = "kube-api-access-"
	// serviceAccountMountPath is where every container finds token, ca.crt and namespace.
	serviceAccountMountPath = "/var/run/secrets/kubernetes.io/serviceaccount"
	// serviceAccountTokenSeconds is the lifetime the token of that volume asks for: Kubernetes' odd hour and
	// seven seconds, which tells its tokens apart from ones a user asked an hour for.
	serviceAccountTokenSeconds = 3607
	// rootCAConfigMap is the ConfigMap the root CA publisher keeps in every namespace (controller/).
	rootCAConfigMap = "kube-root-ca.crt"
)

// serviceAccountAdmission is Kubernetes' ServiceAccount admission, written again on v1 pods (the library's
// casts to kube's internal types). On create, a pod without a service account gets "default"; a pod whose
// account does not exist is refused; unless the pod, or else its account, says automountServiceAccountToken:
// false, every init and regular container gets the projected volume kube-api-access-<random> (a bound token,
// the cluster CA and the namespace) read-only at /var/run/secrets/kubernetes.io/serviceaccount; and a pod
// without imagePullSecrets gets its account's. Mirror pods are not changed, and may not use service accounts
// or secrets. Adding ephemeral containers needs the pod's account to exist. A pod's serviceAccountName never
// changes: pod validation forbids it, as in Kubernetes.
type serviceAccountAdmission struct {
	*admission.Handler
	client   kubernetes.Interface
	accounts corev1listers.ServiceAccountLister
	// generateName names the token volume; retryInterval is the pause between live lookups of "default".
	generateName  func(base string) string
	retryInterval func() time.Duration
}

var (
	_ admission.MutationInterface   = &serviceAccountAdmission{}
	_ admission.ValidationInterface = &serviceAccountAdmission{}
)

func newServiceAccountAdmission(client kubernetes.Interface, factory informers.SharedInformerFactory) *serviceAccountAdmission {
	return &serviceAccountAdmission{
		Handler:      admission.NewHandler(admission.Create, admission.Update),
		client:       client,
		accounts:     factory.Core().V1().ServiceAccounts().Lister(),
		generateName: names.SimpleNameGenerator.GenerateName,
		// Spread as Kubernetes spreads it: 100 to 200 ms.
		retryInterval: func() time.Duration { return time.Duration(100+rand.IntN(100)) * time.Millisecond },
	}
}

// podOf is the pod a request writes, or nil when the plugin has nothing to say about the request.
func podOf(a admission.Attributes) *corev1.Pod {
	if a.GetResource().GroupResource() != podsResource || (a.GetSubresource() != "" && a.GetSubresource() != "ephemeralcontainers") {
		return nil
	}
	pod, _ := a.GetObject().(*corev1.Pod)
	return pod
}

func (p *serviceAccountAdmission) Admit(ctx context.Context, a admission.Attributes, _ admission.ObjectInterfaces) error {
	pod := podOf(a)
	if pod == nil || a.GetOperation() != admission.Create || a.GetSubresource() != "" {
		return nil
	}
	// A mirror pod is the API's copy of a static pod: changing its spec would make the kubelet replace it.
	if _, mirror := pod.Annotations[corev1.MirrorPodAnnotationKey]; mirror {
		return admitMirrorPod(a, pod)
	}
	spec := &pod.Spec
	if spec.ServiceAccountName == "" {
		spec.ServiceAccountName = spec.DeprecatedServiceAccount //nolint:staticcheck // the v1 alias
	}
	if spec.ServiceAccountName == "" {
		spec.ServiceAccountName = defaultServiceAccountName
	}
	spec.DeprecatedServiceAccount = spec.ServiceAccountName //nolint:staticcheck // kept equal, as in Kubernetes
	sa, err := p.serviceAccount(ctx, a.GetNamespace(), spec.ServiceAccountName)
	if err != nil {
		return lookupRefused(a, spec.ServiceAccountName, err)
	}
	if automountToken(sa, pod) {
		p.mountToken(pod)
	}
	if len(spec.ImagePullSecrets) == 0 {
		for _, ref := range sa.ImagePullSecrets {
			spec.ImagePullSecrets = append(spec.ImagePullSecrets, corev1.LocalObjectReference{Name: ref.Name})
		}
	}
	return nil
}

// Validate checks what the ephemeralcontainers subresource adds: the pod's account must still exist.
func (p *serviceAccountAdmission) Validate(ctx context.Context, a admission.Attributes, _ admission.ObjectInterfaces) error {
	pod := podOf(a)
	if pod == nil || a.GetOperation() != admission.Update || a.GetSubresource() != "ephemeralcontainers" {
		return nil
	}
	if pod.Spec.ServiceAccountName == "" {
		return admission.NewForbidden(a, fmt.Errorf("no service account specified for pod %s/%s", a.GetNamespace(), pod.Name))
	}
	if _, err := p.serviceAccount(ctx, a.GetNamespace(), pod.Spec.ServiceAccountName); err != nil {
		return lookupRefused(a, pod.Spec.ServiceAccountName, err)
	}
	return nil
}

// lookupRefused is Kubernetes' refusal of a pod whose service account cannot be found (403, "error looking up
// service account ns/name: serviceaccount "name" not found").
func lookupRefused(a admission.Attributes, name string, err error) error {
	return admission.NewForbidden(a, fmt.Errorf("error looking up service account %s/%s: %w", a.GetNamespace(), name, err))
}

// admitMirrorPod refuses a mirror pod that refers to a service account, a secret or a token projection, as
// Kubernetes does. It runs before the pod's defaults, which would name the "default" account.
func admitMirrorPod(a admission.Attributes, pod *corev1.Pod) error {
	spec := &pod.Spec
	if spec.ServiceAccountName != "" || spec.DeprecatedServiceAccount != "" { //nolint:staticcheck // the v1 alias
		return admission.NewForbidden(a, fmt.Errorf("a mirror pod may not reference service accounts"))
	}
	if referencesSecrets(spec) {
		return admission.NewForbidden(a, fmt.Errorf("a mirror pod may not reference secrets"))
	}
	for _, v := range spec.Volumes {
		if v.Projected == nil {
			continue
		}
		for _, src := range v.Projected.Sources {
			if src.ServiceAccountToken != nil {
				return admission.NewForbidden(a, fmt.Errorf("a mirror pod may not use ServiceAccountToken volume projections"))
			}
		}
	}
	return nil
}

// referencesSecrets says whether a pod spec names a Secret: image pull secrets, secret volumes and
// projections, and the env of any container.
func referencesSecrets(spec *corev1.PodSpec) bool {
	if len(spec.ImagePullSecrets) > 0 {
		return true
	}
	for _, v := range spec.Volumes {
		if v.Secret != nil {
			return true
		}
		if v.Projected != nil {
			for _, src := range v.Projected.Sources {
				if src.Secret != nil {
					return true
				}
			}
		}
	}
	envs := func(env []corev1.EnvVar, from []corev1.EnvFromSource) bool {
		for _, e := range env {
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
				return true
			}
		}
		for _, f := range from {
			if f.SecretRef != nil {
				return true
			}
		}
		return false
	}
	for _, list := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for _, c := range list {
			if envs(c.Env, c.EnvFrom) {
				return true
			}
		}
	}
	for _, c := range spec.EphemeralContainers {
		if envs(c.Env, c.EnvFrom) {
			return true
		}
	}
	return false
}

// serviceAccount looks an account up in the informer and, when it is not there (yet), in the store itself:
// once for a named account, and for up to ten tries for "default", which the serviceaccount controller
// creates with the namespace, so that a pod created right after its namespace is not refused.
func (p *serviceAccountAdmission) serviceAccount(ctx context.Context, namespace, name string) (*corev1.ServiceAccount, error) {
	sa, err := p.accounts.ServiceAccounts(namespace).Get(name)
	if err == nil {
		return sa, nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, err
	}
	attempts := 1
	if name == defaultServiceAccountName {
		attempts = 10
	}
	interval := p.retryInterval()
	for i := 0; i < attempts; i++ {
		if i > 0 {
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(interval):
			}
		}
		sa, err := p.client.CoreV1().ServiceAccounts(namespace).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			return sa, nil
		}
		if !apierrors.IsNotFound(err) {
			return nil, err
		}
	}
	return nil, apierrors.NewNotFound(corev1.Resource("serviceaccount"), name)
}

// automountToken says whether the pod gets the token volume: the pod's choice, else its account's, else yes.
func automountToken(sa *corev1.ServiceAccount, pod *corev1.Pod) bool {
	if v := pod.Spec.AutomountServiceAccountToken; v != nil {
		return *v
	}
	if v := sa.AutomountServiceAccountToken; v != nil {
		return *v
	}
	return true
}

// mountToken mounts the token volume into every init and regular container that has nothing mounted at the
// path already, and adds the volume if some container mounts it and the pod has no kube-api-access-* volume of
// its own. Ephemeral containers are left alone, as in Kubernetes.
func (p *serviceAccountAdmission) mountToken(pod *corev1.Pod) {
	spec := &pod.Spec
	name := ""
	for _, v := range spec.Volumes {
		if strings.HasPrefix(v.Name, serviceAccountVolumePrefix) {
			name = v.Name
			break
		}
	}
	hasVolume := name != ""
	if !hasVolume {
		name = p.generateName(serviceAccountVolumePrefix)
	}
	mounted := false
	for _, list := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for i := range list {
			c := &list[i]
			taken := false
			for _, m := range c.VolumeMounts {
				if m.MountPath == serviceAccountMountPath {
					taken = true
					break
				}
			}
			if !taken {
				c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: name, ReadOnly: true, MountPath: serviceAccountMountPath})
				mounted = true
			}
		}
	}
	if mounted && !hasVolume {
		spec.Volumes = append(spec.Volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{Projected: tokenVolumeSource()}})
	}
}

// tokenVolumeSource is the kube-api-access volume: a token bound to the pod, the cluster CA that signs the
// API's serving certificate, and the pod's namespace.
func tokenVolumeSource() *corev1.ProjectedVolumeSource {
	mode := corev1.ProjectedVolumeSourceDefaultMode
	seconds := int64(serviceAccountTokenSeconds)
	return &corev1.ProjectedVolumeSource{
		DefaultMode: &mode,
		Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: &seconds}},
			{ConfigMap: &corev1.ConfigMapProjection{
				LocalObjectReference: corev1.LocalObjectReference{Name: rootCAConfigMap},
				Items:                []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}},
			}},
			{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{
				{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}},
			}}},
		},
	}
}
