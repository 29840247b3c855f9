package admission

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apiserver/pkg/admission"
	"k8s.io/client-go/informers"
	schedulinglisters "k8s.io/client-go/listers/scheduling/v1"
)

// The built-in classes, which exist in every cluster with these values (Kubernetes' scheduling API).
var builtinPriorityClasses = map[string]int32{
	"system-cluster-critical": 2000000000,
	"system-node-critical":    2000001000,
}

// priorityAdmission resolves a new pod's priorityClassName into spec.priority and spec.preemptionPolicy,
// as Kubernetes' Priority admission plugin does: no name takes the globalDefault class (or 0), an unknown
// name is refused, and a priority the client set itself must agree with the class.
type priorityAdmission struct {
	*admission.Handler
	classes schedulinglisters.PriorityClassLister
}

func newPriorityAdmission(factory informers.SharedInformerFactory) *priorityAdmission {
	informer := factory.Scheduling().V1().PriorityClasses()
	p := &priorityAdmission{Handler: admission.NewHandler(admission.Create), classes: informer.Lister()}
	p.SetReadyFunc(informer.Informer().HasSynced)
	return p
}

var _ admission.MutationInterface = &priorityAdmission{}

func (p *priorityAdmission) Admit(ctx context.Context, a admission.Attributes, _ admission.ObjectInterfaces) error {
	if a.GetResource().GroupResource() != corev1.Resource("pods") || a.GetSubresource() != "" {
		return nil
	}
	pod, ok := a.GetObject().(*corev1.Pod)
	if !ok {
		return apierrors.NewBadRequest("resource was marked with kind Pod but was unable to be converted")
	}
	if !p.WaitForReady() {
		return admission.NewForbidden(a, fmt.Errorf("not yet ready to handle request"))
	}
	var value int32
	var policy *corev1.PreemptionPolicy
	name := pod.Spec.PriorityClassName
	switch builtin, isBuiltin := builtinPriorityClasses[name]; {
	case name == "":
		if def := p.globalDefault(); def != nil {
			pod.Spec.PriorityClassName, value, policy = def.Name, def.Value, def.PreemptionPolicy
		}
	case isBuiltin:
		value = builtin
	default:
		class, err := p.classes.Get(name)
		if apierrors.IsNotFound(err) {
			return admission.NewForbidden(a, fmt.Errorf("no PriorityClass with name %v was found", name))
		}
		if err != nil {
			return apierrors.NewInternalError(fmt.Errorf("failed to get PriorityClass with name %s: %w", name, err))
		}
		value, policy = class.Value, class.PreemptionPolicy
	}
	if pod.Spec.Priority != nil && *pod.Spec.Priority != value {
		return admission.NewForbidden(a, fmt.Errorf("the integer value of priority (%d) must not be provided in pod spec; priority admission controller computed %d from the given PriorityClass name", *pod.Spec.Priority, value))
	}
	if pod.Spec.PreemptionPolicy != nil && policy != nil && *pod.Spec.PreemptionPolicy != *policy {
		return admission.NewForbidden(a, fmt.Errorf("the string value of PreemptionPolicy (%s) must not be provided in pod spec; priority admission controller computed %s from the given PriorityClass name", *pod.Spec.PreemptionPolicy, *policy))
	}
	pod.Spec.Priority = &value
	if pod.Spec.PreemptionPolicy == nil {
		if policy == nil {
			lower := corev1.PreemptLowerPriority
			policy = &lower
		}
		pod.Spec.PreemptionPolicy = policy
	}
	return nil
}

// globalDefault is the class marked globalDefault, the lowest if several are.
func (p *priorityAdmission) globalDefault() *schedulingv1.PriorityClass {
	all, err := p.classes.List(labels.Everything())
	if err != nil {
		return nil
	}
	var def *schedulingv1.PriorityClass
	for _, c := range all {
		if c.GlobalDefault && (def == nil || c.Value < def.Value) {
			def = c
		}
	}
	return def
}
