package admission

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apiserver/pkg/admission"
)

// defaultTolerationAdmission gives every new or updated pod tolerations of the not-ready and unreachable NoExecute
// taints for a bounded time, unless it has its own, as Kubernetes' DefaultTolerationSeconds plugin does. So a
// pod on a lost node is evicted after that time (300 s by default), not at once.
type defaultTolerationAdmission struct {
	*admission.Handler
	seconds int64
}

func newDefaultTolerationAdmission(seconds int64) *defaultTolerationAdmission {
	// Updates too, as Kubernetes' plugin: an update that replaces the tolerations gets the defaults back, and
	// so keeps the ones the pod was created with (pod validation lets tolerations be added, never removed).
	return &defaultTolerationAdmission{Handler: admission.NewHandler(admission.Create, admission.Update), seconds: seconds}
}

var _ admission.MutationInterface = &defaultTolerationAdmission{}

// The taints the node lifecycle controller puts on lost nodes.
var lostNodeTaints = []string{"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}

func (d *defaultTolerationAdmission) Admit(_ context.Context, a admission.Attributes, _ admission.ObjectInterfaces) error {
	if a.GetResource().GroupResource() != corev1.Resource("pods") || a.GetSubresource() != "" {
		return nil
	}
	pod, ok := a.GetObject().(*corev1.Pod)
	if !ok {
		return apierrors.NewBadRequest("resource was marked with kind Pod but was unable to be converted")
	}
	for _, key := range lostNodeTaints {
		if toleratesNoExecute(pod.Spec.Tolerations, key) {
			continue
		}
		seconds := d.seconds
		pod.Spec.Tolerations = append(pod.Spec.Tolerations, corev1.Toleration{
			Key: key, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: &seconds,
		})
	}
	return nil
}

// toleratesNoExecute tells whether some toleration already covers the key's NoExecute taint.
func toleratesNoExecute(tolerations []corev1.Toleration, key string) bool {
	for _, t := range tolerations {
		if (t.Key == key || (t.Key == "" && t.Operator == corev1.TolerationOpExists)) &&
			(t.Effect == corev1.TaintEffectNoExecute || t.Effect == "") {
			return true
		}
	}
	return false
}
