// Package quotaconfig is the resource quota system the API's ResourceQuota admission and the leader's quota
// controller share: Kubernetes' evaluators for the kinds Skiff serves.
package quotaconfig

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	quota "k8s.io/apiserver/pkg/quota/v1"
	"k8s.io/apiserver/pkg/quota/v1/generic"
	"k8s.io/client-go/informers"
	quotacore "k8s.io/kubernetes/pkg/quota/v1/evaluator/core"
	quotainstall "k8s.io/kubernetes/pkg/quota/v1/install"
)

// served are the kinds with an evaluator of their own (DRA's resource claims are not served); every other
// kind is counted by object count evaluators (count/<resource>.<group>).
var served = map[schema.GroupResource]bool{
	{Resource: "pods"}: true, {Resource: "services"}: true, {Resource: "persistentvolumeclaims"}: true,
}

// New is Kubernetes' quota configuration over the informers, with Kubernetes' ignored resources (events,
// reviews, bindings). listerFor may be nil: admission reads through the evaluators' informers.
func New(factory informers.SharedInformerFactory, listerFor quota.ListerForResourceFunc) (quota.Configuration, error) {
	evaluators, err := quotacore.NewEvaluators(listerFor, factory, func(gvr schema.GroupVersionResource) bool {
		return served[gvr.GroupResource()]
	})
	if err != nil {
		return nil, err
	}
	return generic.NewConfiguration(evaluators, quotainstall.DefaultIgnoredResources()), nil
}
