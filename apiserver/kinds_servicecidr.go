package apiserver

import (
	"net"

	"k8s.io/apimachinery/pkg/runtime"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/client-go/kubernetes"
	"k8s.io/kubernetes/pkg/apis/networking"
	"k8s.io/kubernetes/pkg/controlplane/controller/defaultservicecidr"
	ipaddressregistry "k8s.io/kubernetes/pkg/registry/networking/ipaddress"
	servicecidrregistry "k8s.io/kubernetes/pkg/registry/networking/servicecidr"
)

// networking.k8s.io/v1 IPAddresses, with kube's strategy (the name is an IP address in canonical form, the
// parentRef names a resource and an object): Services hold their ClusterIPs as IPAddresses (services.go).
//
// networking.k8s.io/v1 ServiceCIDRs, with kube's registry strategies and validation: the default ServiceCIDR
// "kubernetes", which holds the servers' service_cidr and is created, kept Ready and re-created by
// kube-apiserver's own default ServiceCIDR controller on every server, and any others a user adds, which the
// leader's servicecidrs controller (kube-controller-manager's) marks Ready and keeps from being deleted while
// Services hold addresses only they cover. ClusterIPs come from all of them (services.go allocationRanges),
// as with kube-apiserver's MultiCIDRServiceAllocator.

var ipAddressStrategies = &kubeStrategies{
	internal: func() runtime.Object { return &networking.IPAddress{} },
	main:     ipaddressregistry.Strategy,
}

var serviceCIDRStrategies = &kubeStrategies{
	internal:     func() runtime.Object { return &networking.ServiceCIDR{} },
	main:         servicecidrregistry.Strategy,
	subresources: map[string]kubeStrategy{"status": servicecidrregistry.StatusStrategy},
}

// defaultServiceCIDRHook runs kube-apiserver's default ServiceCIDR controller for serviceCIDR on this server
// through the loopback client: it creates "kubernetes" when missing, marks it Ready, and reports a
// configuration that differs from it in an event. It does not hold the server's readiness.
func defaultServiceCIDRHook(serviceCIDR *net.IPNet) genericapiserver.PostStartHookFunc {
	return func(hook genericapiserver.PostStartHookContext) error {
		client, err := kubernetes.NewForConfig(hook.LoopbackClientConfig)
		if err != nil {
			return err
		}
		go defaultservicecidr.NewController(*serviceCIDR, net.IPNet{}, client).Start(hook)
		return nil
	}
}
