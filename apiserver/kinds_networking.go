package apiserver

import (
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/kubernetes/pkg/apis/networking"
	kubenetworkingv1 "k8s.io/kubernetes/pkg/apis/networking/v1"
	"k8s.io/kubernetes/pkg/apis/node"
	kubenodev1 "k8s.io/kubernetes/pkg/apis/node/v1"
	ingressregistry "k8s.io/kubernetes/pkg/registry/networking/ingress"
	ingressclassregistry "k8s.io/kubernetes/pkg/registry/networking/ingressclass"
	networkpolicyregistry "k8s.io/kubernetes/pkg/registry/networking/networkpolicy"
	runtimeclassregistry "k8s.io/kubernetes/pkg/registry/node/runtimeclass"
)

// networking.k8s.io/v1 Ingresses, IngressClasses and NetworkPolicies, and node.k8s.io/v1 RuntimeClasses,
// with kube-apiserver's registry strategies and validation, run on kube's internal types through the
// converting adapter (kubestrategy.go), and kube's table printers. An Ingress controller installed on the
// cluster serves Ingresses; a RuntimeClass's handler is the agent's to run (or refuse).

func init() {
	utilruntime.Must(networking.AddToScheme(kubeScheme))
	utilruntime.Must(kubenetworkingv1.AddToScheme(kubeScheme))
	utilruntime.Must(node.AddToScheme(kubeScheme))
	utilruntime.Must(kubenodev1.AddToScheme(kubeScheme))
}

var (
	ingressStrategies = &kubeStrategies{
		internal:     func() runtime.Object { return &networking.Ingress{} },
		main:         ingressregistry.Strategy,
		subresources: map[string]kubeStrategy{"status": ingressregistry.StatusStrategy},
	}
	ingressClassStrategies = &kubeStrategies{
		internal: func() runtime.Object { return &networking.IngressClass{} },
		main:     ingressclassregistry.Strategy,
	}
	networkPolicyStrategies = &kubeStrategies{
		internal: func() runtime.Object { return &networking.NetworkPolicy{} },
		main:     networkpolicyregistry.Strategy,
	}
	runtimeClassStrategies = &kubeStrategies{
		internal: func() runtime.Object { return &node.RuntimeClass{} },
		main:     runtimeclassregistry.Strategy,
	}
)
