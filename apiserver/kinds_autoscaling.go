package apiserver

import (
	"fmt"

	autoscalingv1 "k8s.io/api/autoscaling/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	"k8s.io/apimachinery/pkg/conversion"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/kubernetes/pkg/apis/autoscaling"
	kubeautoscalingv1 "k8s.io/kubernetes/pkg/apis/autoscaling/v1"
	kubeautoscalingv2 "k8s.io/kubernetes/pkg/apis/autoscaling/v2"
	hparegistry "k8s.io/kubernetes/pkg/registry/autoscaling/horizontalpodautoscaler"
)

// HorizontalPodAutoscalers are served as kube-apiserver serves them: in autoscaling/v2, the version they are
// stored in and whose type is the group's internal one (scheme.go), and in autoscaling/v1, which the scheme
// converts to and from v2 through kube's internal type with kube's own conversions. Those keep what v1 cannot
// say (metrics other than CPU utilization, the behavior, the conditions, the current metrics) in the v1
// object's autoscaling.alpha.kubernetes.io/* annotations, and take it back from them, so that a v2 object
// read, changed and written back through v1 loses nothing. Kube's registry strategies run on kube's internal
// type through the converting adapter (kubestrategy.go): status only through /status, generation bumped on
// a spec change, and kube's validation with field paths (minReplicas at least 1, maxReplicas at least
// minReplicas, a scale target with a kind and a name, well-formed metrics and behavior). Kube's printers
// make `kubectl get hpa`'s table. Kube's horizontal pod autoscaler controller keeps their status and scales
// their targets (controller/podautoscaler.go).

func init() {
	// kube's internal autoscaling types, the v2 and v1 ones, and kube's conversions and defaults between them.
	utilruntime.Must(autoscaling.AddToScheme(kubeScheme))
	utilruntime.Must(kubeautoscalingv2.AddToScheme(kubeScheme))
	utilruntime.Must(kubeautoscalingv1.AddToScheme(kubeScheme))

	// The served scheme converts v1 to v2 (the group's internal version) and back, through kube's internal
	// type.
	viaInternal := func(internal func() runtime.Object) conversion.ConversionFunc {
		return func(a, b any, _ conversion.Scope) error {
			in := internal()
			if err := kubeScheme.Convert(a, in, nil); err != nil {
				return fmt.Errorf("converting %T to kube's internal type: %w", a, err)
			}
			return kubeScheme.Convert(in, b, nil)
		}
	}
	hpa := func() runtime.Object { return &autoscaling.HorizontalPodAutoscaler{} }
	hpaList := func() runtime.Object { return &autoscaling.HorizontalPodAutoscalerList{} }
	for _, c := range []struct {
		from, to any
		internal func() runtime.Object
	}{
		{(*autoscalingv1.HorizontalPodAutoscaler)(nil), (*autoscalingv2.HorizontalPodAutoscaler)(nil), hpa},
		{(*autoscalingv2.HorizontalPodAutoscaler)(nil), (*autoscalingv1.HorizontalPodAutoscaler)(nil), hpa},
		{(*autoscalingv1.HorizontalPodAutoscalerList)(nil), (*autoscalingv2.HorizontalPodAutoscalerList)(nil), hpaList},
		{(*autoscalingv2.HorizontalPodAutoscalerList)(nil), (*autoscalingv1.HorizontalPodAutoscalerList)(nil), hpaList},
	} {
		utilruntime.Must(Scheme.AddConversionFunc(c.from, c.to, viaInternal(c.internal)))
	}
}

// horizontalPodAutoscalerStrategies are kube's HorizontalPodAutoscaler strategies: the resource and /status
// (the controller's current and desired replicas, metrics and conditions).
var horizontalPodAutoscalerStrategies = &kubeStrategies{
	internal:     func() runtime.Object { return &autoscaling.HorizontalPodAutoscaler{} },
	main:         hparegistry.Strategy,
	subresources: map[string]kubeStrategy{"status": hparegistry.StatusStrategy},
}
