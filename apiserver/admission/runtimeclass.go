package admission

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	nodelisters "k8s.io/client-go/listers/node/v1"
)

// runtimeClassAdmission is Kubernetes' RuntimeClass plugin on v1 pods: a new pod naming a RuntimeClass that
// does not exist is refused; the class's overhead becomes the pod's spec.overhead (a different one the pod
// brings is refused, as is an overhead without a class that defines one); the class's scheduling node
// selector is merged into the pod's (a conflicting value is refused) and its tolerations added.
type runtimeClassAdmission struct {
	*admission.Handler
	classes nodelisters.RuntimeClassLister
	client  kubernetes.Interface
}

func newRuntimeClassAdmission(client kubernetes.Interface, factory informers.SharedInformerFactory) *runtimeClassAdmission {
	informer := factory.Node().V1().RuntimeClasses()
	r := &runtimeClassAdmission{Handler: admission.NewHandler(admission.Create), classes: informer.Lister(), client: client}
	r.SetReadyFunc(informer.Informer().HasSynced)
	return r
}

var (
	_ admission.MutationInterface   = &runtimeClassAdmission{}
	_ admission.ValidationInterface = &runtimeClassAdmission{}
)

func (r *runtimeClassAdmission) Admit(ctx context.Context, a admission.Attributes, _ admission.ObjectInterfaces) error {
	pod, class, err := r.podAndClass(ctx, a)
	if err != nil || class == nil {
		return err
	}
	if class.Overhead != nil {
		if len(pod.Spec.Overhead) > 0 && !apiequality.Semantic.DeepEqual(class.Overhead.PodFixed, pod.Spec.Overhead) {
			return admission.NewForbidden(a, fmt.Errorf("pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead"))
		}
		pod.Spec.Overhead = class.Overhead.PodFixed.DeepCopy()
	}
	if class.Scheduling == nil {
		return nil
	}
	for key, value := range class.Scheduling.NodeSelector {
		if podValue, ok := pod.Spec.NodeSelector[key]; ok && podValue != value {
			return admission.NewForbidden(a, fmt.Errorf("conflict: runtimeClass.scheduling.nodeSelector[%s] = %s; pod.spec.nodeSelector[%s] = %s", key, value, key, podValue))
		}
		if pod.Spec.NodeSelector == nil {
			pod.Spec.NodeSelector = map[string]string{}
		}
		pod.Spec.NodeSelector[key] = value
	}
	for _, t := range class.Scheduling.Tolerations {
		if !hasToleration(pod.Spec.Tolerations, t) {
			pod.Spec.Tolerations = append(pod.Spec.Tolerations, t)
		}
	}
	return nil
}

// Validate checks, after the webhooks, that the pod's overhead is still its class's.
func (r *runtimeClassAdmission) Validate(ctx context.Context, a admission.Attributes, _ admission.ObjectInterfaces) error {
	pod, class, err := r.podAndClass(ctx, a)
	if err != nil || pod == nil {
		return err
	}
	if class != nil && class.Overhead != nil {
		if !apiequality.Semantic.DeepEqual(class.Overhead.PodFixed, pod.Spec.Overhead) {
			return admission.NewForbidden(a, fmt.Errorf("pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead"))
		}
	} else if pod.Spec.Overhead != nil {
		return admission.NewForbidden(a, fmt.Errorf("pod rejected: Pod Overhead set without corresponding RuntimeClass defined Overhead"))
	}
	return nil
}

// podAndClass is the pod being created and the RuntimeClass it names (nil for none); nil, nil for any other
// request. A class not yet in the informer's cache is read from the API, as kube's plugin does.
func (r *runtimeClassAdmission) podAndClass(ctx context.Context, a admission.Attributes) (*corev1.Pod, *nodev1.RuntimeClass, error) {
	if a.GetResource().GroupResource() != corev1.Resource("pods") || a.GetSubresource() != "" {
		return nil, nil, nil
	}
	pod, ok := a.GetObject().(*corev1.Pod)
	if !ok {
		return nil, nil, apierrors.NewBadRequest("resource was marked with kind Pod but was unable to be converted")
	}
	if pod.Spec.RuntimeClassName == nil {
		return pod, nil, nil
	}
	name := *pod.Spec.RuntimeClassName
	class, err := r.classes.Get(name)
	if apierrors.IsNotFound(err) {
		class, err = r.client.NodeV1().RuntimeClasses().Get(ctx, name, metav1.GetOptions{})
	}
	if apierrors.IsNotFound(err) {
		return nil, nil, admission.NewForbidden(a, fmt.Errorf("pod rejected: RuntimeClass %q not found", name))
	}
	if err != nil {
		return nil, nil, apierrors.NewInternalError(fmt.Errorf("failed to get RuntimeClass %q: %w", name, err))
	}
	return pod, class, nil
}

// hasToleration tells whether a toleration equal to t is among ts.
func hasToleration(ts []corev1.Toleration, t corev1.Toleration) bool {
	for i := range ts {
		if apiequality.Semantic.DeepEqual(ts[i], t) {
			return true
		}
	}
	return false
}
