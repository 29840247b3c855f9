package apiserver

import (
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/kubernetes/pkg/apis/policy"
	kubepolicyv1 "k8s.io/kubernetes/pkg/apis/policy/v1"
	pdbregistry "k8s.io/kubernetes/pkg/registry/policy/poddisruptionbudget"
)

// PodDisruptionBudgets (policy/v1) follow Kubernetes' own contract: kube's registry strategies (status only
// through /status, generation bumped on a spec change, the v1beta1 match-none label stripped from selectors)
// and validation with field paths (minAvailable and maxUnavailable exclusive, non-negative or a percentage up
// to 100%, a valid selector and unhealthyPodEvictionPolicy), run on kube's internal types through the
// converting adapter (kubestrategy.go). Kube's disruption controller keeps their status
// (controller/disruption.go), and the pod eviction subresource honours them (eviction.go).

func init() {
	// kube's internal policy types, the v1 ones, and kube's conversions and v1 defaults between them.
	utilruntime.Must(policy.AddToScheme(kubeScheme))
	utilruntime.Must(kubepolicyv1.AddToScheme(kubeScheme))
}

// podDisruptionBudgetStrategies are kube's PodDisruptionBudget strategies: the resource and /status (the
// disruption controller's counts, and the eviction subresource's decrements).
var podDisruptionBudgetStrategies = &kubeStrategies{
	internal:     func() runtime.Object { return &policy.PodDisruptionBudget{} },
	main:         pdbregistry.Strategy,
	subresources: map[string]kubeStrategy{"status": pdbregistry.StatusStrategy},
}

// podDisruptionBudgetColumns are `kubectl get pdb`'s columns, as kube-apiserver prints them.
var podDisruptionBudgetColumns = []column{
	nameColumn,
	{name: "Min Available", typ: "string", value: func(o runtime.Object) any {
		if v := o.(*policyv1.PodDisruptionBudget).Spec.MinAvailable; v != nil {
			return v.String()
		}
		return "N/A"
	}},
	{name: "Max Unavailable", typ: "string", value: func(o runtime.Object) any {
		if v := o.(*policyv1.PodDisruptionBudget).Spec.MaxUnavailable; v != nil {
			return v.String()
		}
		return "N/A"
	}},
	{name: "Allowed Disruptions", typ: "integer", value: func(o runtime.Object) any {
		return int64(o.(*policyv1.PodDisruptionBudget).Status.DisruptionsAllowed)
	}},
	ageColumn,
}
