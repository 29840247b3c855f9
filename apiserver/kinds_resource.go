package apiserver

import (
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	resourceapi "k8s.io/kubernetes/pkg/apis/resource"
	kuberesourcev1 "k8s.io/kubernetes/pkg/apis/resource/v1"
	"k8s.io/kubernetes/pkg/registry/resource/deviceclass"
	"k8s.io/kubernetes/pkg/registry/resource/devicetaintrule"
	"k8s.io/kubernetes/pkg/registry/resource/resourceclaim"
	"k8s.io/kubernetes/pkg/registry/resource/resourceclaimtemplate"
	"k8s.io/kubernetes/pkg/registry/resource/resourceslice"
)

// Dynamic Resource Allocation's API, resource.k8s.io/v1, as kube-apiserver 1.37 serves it by default:
// DeviceClasses, ResourceClaims (status only through /status), ResourceClaimTemplates, ResourceSlices and
// DeviceTaintRules (status only through /status), with kube's registry strategies and validation (field
// paths), run on kube's internal types through the converting adapter (kubestrategy.go), and kube's printers
// for their tables. Skiff stores and serves these objects; it does not allocate devices to claims (no
// scheduler plugin, no node agent plugin), so a claim stays unallocated unless a client writes its status.
//
// Kube's declarative validation is not run (kubestrategy.go). In v1.37 the resource.k8s.io rules declared
// only that way are on alpha fields (a slice's partitionTypeAttribute and skipNodeOperations), which the
// strategies drop while their feature gates (DRAPartitionableDevicesType, DRAOptionalNodeOperations) are off,
// as they are by default; the other declared rules are still reported by the handwritten validation.

func init() {
	// kube's internal resource types, the v1 ones, and kube's conversions and v1 defaults between them.
	utilruntime.Must(resourceapi.AddToScheme(kubeScheme))
	utilruntime.Must(kuberesourcev1.AddToScheme(kubeScheme))
}

var (
	deviceClassStrategies = &kubeStrategies{
		internal: func() runtime.Object { return &resourceapi.DeviceClass{} },
		main:     deviceclass.Strategy,
	}
	resourceSliceStrategies = &kubeStrategies{
		internal: func() runtime.Object { return &resourceapi.ResourceSlice{} },
		main:     resourceslice.Strategy,
	}
	deviceTaintRuleStrategies = &kubeStrategies{
		internal:     func() runtime.Object { return &resourceapi.DeviceTaintRule{} },
		main:         devicetaintrule.Strategy,
		subresources: map[string]kubeStrategy{"status": devicetaintrule.StatusStrategy},
	}
)

// resourceClaimStrategies are built per server, as kube-apiserver builds them
// (pkg/registry/resource/rest/storage_resource.go): admin access to devices needs the namespace's
// resource.kubernetes.io/admin-access label, read through the loopback client, and the status checks
// (DRAResourceClaimGranularStatusAuthorization) ask the server's authorizer whether the writer may bind
// claims or report device status.
func resourceClaimStrategies(d serverDeps) *kubeStrategies {
	main := resourceclaim.NewStrategy(d.namespaces, d.authorizer)
	return &kubeStrategies{
		internal:     func() runtime.Object { return &resourceapi.ResourceClaim{} },
		main:         main,
		subresources: map[string]kubeStrategy{"status": resourceclaim.NewStatusStrategy(main)},
	}
}

// resourceClaimTemplateStrategies check admin access against the namespace's label, as claims do.
func resourceClaimTemplateStrategies(d serverDeps) *kubeStrategies {
	return &kubeStrategies{
		internal: func() runtime.Object { return &resourceapi.ResourceClaimTemplate{} },
		main:     resourceclaimtemplate.NewStrategy(d.namespaces),
	}
}

// resourceSliceFieldNames are the field selectors kube-apiserver accepts for ResourceSlices besides
// metadata.name: node agents and drivers list the slices of their node and driver.
var resourceSliceFieldNames = []string{resourcev1.ResourceSliceSelectorNodeName, resourcev1.ResourceSliceSelectorDriver,
	resourcev1.ResourceSliceSelectorPoolName}

// resourceSliceFields are those fields' values; a slice without a node has spec.nodeName "".
func resourceSliceFields(o runtime.Object) fields.Set {
	s := o.(*resourcev1.ResourceSlice)
	node := ""
	if s.Spec.NodeName != nil {
		node = *s.Spec.NodeName
	}
	return fields.Set{resourcev1.ResourceSliceSelectorNodeName: node, resourcev1.ResourceSliceSelectorDriver: s.Spec.Driver,
		resourcev1.ResourceSliceSelectorPoolName: s.Spec.Pool.Name}
}
