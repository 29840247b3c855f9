package apiserver

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/kubernetes/pkg/apis/core"
	corevalidation "k8s.io/kubernetes/pkg/apis/core/validation"
	configmapregistry "k8s.io/kubernetes/pkg/registry/core/configmap"
	limitrangeregistry "k8s.io/kubernetes/pkg/registry/core/limitrange"
	podtemplateregistry "k8s.io/kubernetes/pkg/registry/core/podtemplate"
	rcregistry "k8s.io/kubernetes/pkg/registry/core/replicationcontroller"
	secretregistry "k8s.io/kubernetes/pkg/registry/core/secret"
)

// Namespaces.

func defaultNamespace(o runtime.Object) {
	ns := o.(*corev1.Namespace)
	if ns.Status.Phase == "" {
		ns.Status.Phase = corev1.NamespaceActive
	}
	// The finalizer the namespace controller removes once the namespace is empty.
	has := false
	for _, f := range ns.Spec.Finalizers {
		has = has || f == corev1.FinalizerKubernetes
	}
	if !has {
		ns.Spec.Finalizers = append(ns.Spec.Finalizers, corev1.FinalizerKubernetes)
	}
}

func namespaceFields(o runtime.Object) fields.Set {
	return fields.Set{"status.phase": string(o.(*corev1.Namespace).Status.Phase)}
}

func namespaceStatus(o runtime.Object) interface{} { return string(o.(*corev1.Namespace).Status.Phase) }

// ConfigMaps and Secrets.

func configMapData(o runtime.Object) interface{} {
	cm := o.(*corev1.ConfigMap)
	return int64(len(cm.Data) + len(cm.BinaryData))
}

// defaultSecret sets the type and folds the write-only stringData into data (stringData wins), as the
// conversion to the internal type does in kube-apiserver.
func defaultSecret(o runtime.Object) {
	s := o.(*corev1.Secret)
	if s.Type == "" {
		s.Type = corev1.SecretTypeOpaque
	}
	if len(s.StringData) > 0 && s.Data == nil {
		s.Data = map[string][]byte{}
	}
	for k, v := range s.StringData {
		s.Data[k] = []byte(v)
	}
	s.StringData = nil
}

func secretFields(o runtime.Object) fields.Set {
	return fields.Set{"type": string(o.(*corev1.Secret).Type)}
}
func secretType(o runtime.Object) interface{} { return string(o.(*corev1.Secret).Type) }
func secretData(o runtime.Object) interface{} { return int64(len(o.(*corev1.Secret).Data)) }

// configMapStrategies and secretStrategies are kube-apiserver's: key validation (a Secret's keys may not be
// empty) and immutability (an immutable ConfigMap's or Secret's data, and its immutable flag, never change).
var (
	configMapStrategies = &kubeStrategies{
		internal: func() runtime.Object { return &core.ConfigMap{} },
		main:     configmapregistry.Strategy,
	}
	secretStrategies = &kubeStrategies{
		internal: func() runtime.Object { return &core.Secret{} },
		main:     secretregistry.Strategy,
	}
)

// podTemplateStrategies are kube-apiserver's: a PodTemplate's template is validated as a pod's, and its
// generation counts template changes.
var podTemplateStrategies = &kubeStrategies{
	internal: func() runtime.Object { return &core.PodTemplate{} },
	main:     podtemplateregistry.Strategy,
}

// replicationControllerStrategies are kube-apiserver's for core/v1 ReplicationControllers, the kind
// ReplicaSets replaced and kubectl and the conformance suite still use: kube's v1 defaults (the selector
// and labels taken from the template's labels, one replica), validation with field paths, generation
// counting spec changes, status only through /status, and v1 deletes orphaning the pods unless asked
// otherwise. Its pod template (optional in the API) must also pass Skiff's pod rules. Kubernetes' own
// replication manager runs them (controller/replication.go).
var replicationControllerStrategies = &kubeStrategies{
	internal: func() runtime.Object { return &core.ReplicationController{} },
	main: templateLimited{rcregistry.Strategy, func(obj runtime.Object) (*core.PodTemplateSpec, string) {
		return obj.(*core.ReplicationController).Spec.Template, "spec.template"
	}},
	subresources: map[string]kubeStrategy{"status": rcregistry.StatusStrategy},
}

// replicationControllerFields are the fields kube-apiserver selects ReplicationControllers by.
func replicationControllerFields(obj runtime.Object) fields.Set {
	return fields.Set{"status.replicas": strconv.Itoa(int(obj.(*corev1.ReplicationController).Status.Replicas))}
}

// podTemplateColumns are kubectl's for PodTemplates.
var podTemplateColumns = []column{
	nameColumn,
	{name: "Containers", typ: "string", value: func(o runtime.Object) interface{} {
		var names []string
		for _, c := range o.(*corev1.PodTemplate).Template.Spec.Containers {
			names = append(names, c.Name)
		}
		return strings.Join(names, ",")
	}},
	{name: "Images", typ: "string", value: func(o runtime.Object) interface{} {
		var images []string
		for _, c := range o.(*corev1.PodTemplate).Template.Spec.Containers {
			images = append(images, c.Image)
		}
		return strings.Join(images, ",")
	}},
	{name: "Pod Labels", typ: "string", value: func(o runtime.Object) interface{} {
		return labels.FormatLabels(o.(*corev1.PodTemplate).Template.Labels)
	}},
	ageColumn,
}

// Services.

// serviceExternalIP is kubectl's EXTERNAL-IP column, as kube-apiserver's printer has it: a load balancer's
// ingress addresses (shortened past 16 characters) and the externalIPs, <pending> for a LoadBalancer that has
// none, the external name of an ExternalName Service.
func serviceExternalIP(svc *corev1.Service) string {
	external := svc.Spec.ExternalIPs
	switch svc.Spec.Type {
	case corev1.ServiceTypeLoadBalancer:
		var lb []string
		for _, in := range svc.Status.LoadBalancer.Ingress {
			if in.IP != "" {
				lb = append(lb, in.IP)
			} else if in.Hostname != "" {
				lb = append(lb, in.Hostname)
			}
		}
		ips := strings.Join(lb, ",")
		if len(ips) > 16 {
			ips = ips[:13] + "..."
		}
		if ips != "" {
			external = append([]string{ips}, external...)
		}
		if len(external) == 0 {
			return "<pending>"
		}
	case corev1.ServiceTypeExternalName:
		return svc.Spec.ExternalName
	}
	return noneIfEmpty(strings.Join(external, ","))
}

// validateLoadBalancerFields is Kubernetes' validation of the fields only a LoadBalancer Service may set:
// loadBalancerSourceRanges (CIDRs, space-padding allowed), allocateLoadBalancerNodePorts and loadBalancerClass
// (a qualified name).
func validateLoadBalancerFields(svc *corev1.Service) field.ErrorList {
	spec := field.NewPath("spec")
	lb := svc.Spec.Type == corev1.ServiceTypeLoadBalancer
	var errs field.ErrorList
	onlyLB := "may only be used when `type` is 'LoadBalancer'"
	if ranges := svc.Spec.LoadBalancerSourceRanges; len(ranges) > 0 {
		path := spec.Child("LoadBalancerSourceRanges") // sic: Kubernetes' field path
		if !lb {
			errs = append(errs, field.Forbidden(path, onlyLB))
		}
		for i, r := range ranges {
			errs = append(errs, corevalidation.IsValidCIDRForLegacyField(path.Index(i), strings.TrimSpace(r), nil)...)
		}
	}
	if svc.Spec.AllocateLoadBalancerNodePorts != nil && !lb {
		errs = append(errs, field.Forbidden(spec.Child("allocateLoadBalancerNodePorts"), onlyLB))
	}
	if lb && svc.Spec.AllocateLoadBalancerNodePorts == nil {
		errs = append(errs, field.Required(field.NewPath("allocateLoadBalancerNodePorts"), ""))
	}
	if c := svc.Spec.LoadBalancerClass; c != nil {
		if !lb {
			errs = append(errs, field.Forbidden(spec.Child("loadBalancerClass"), onlyLB))
		} else {
			errs = append(errs, corevalidation.ValidateQualifiedName(*c, spec.Child("loadBalancerClass"))...)
		}
	}
	return errs
}

func defaultService(o runtime.Object) {
	svc := o.(*corev1.Service)
	if svc.Spec.Type == "" {
		svc.Spec.Type = corev1.ServiceTypeClusterIP
	}
	if svc.Spec.SessionAffinity == "" {
		svc.Spec.SessionAffinity = corev1.ServiceAffinityNone
	}
	for i := range svc.Spec.Ports {
		p := &svc.Spec.Ports[i]
		if p.Protocol == "" {
			p.Protocol = corev1.ProtocolTCP
		}
		if p.TargetPort.IntVal == 0 && p.TargetPort.StrVal == "" {
			p.TargetPort.IntVal = p.Port
		}
	}
	if svc.Spec.InternalTrafficPolicy == nil && svc.Spec.Type != corev1.ServiceTypeExternalName {
		local := corev1.ServiceInternalTrafficPolicyCluster
		svc.Spec.InternalTrafficPolicy = &local
	}
	if svc.Spec.ExternalTrafficPolicy == "" && hasNodePorts(svc) {
		svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyCluster
	}
	if svc.Spec.Type == corev1.ServiceTypeLoadBalancer && svc.Spec.AllocateLoadBalancerNodePorts == nil {
		allocate := true
		svc.Spec.AllocateLoadBalancerNodePorts = &allocate
	}
	if svc.Spec.SessionAffinity == corev1.ServiceAffinityClientIP {
		if svc.Spec.SessionAffinityConfig == nil {
			svc.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{}
		}
		if svc.Spec.SessionAffinityConfig.ClientIP == nil {
			svc.Spec.SessionAffinityConfig.ClientIP = &corev1.ClientIPConfig{}
		}
		if svc.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds == nil {
			timeout := corev1.DefaultClientIPServiceAffinitySeconds
			svc.Spec.SessionAffinityConfig.ClientIP.TimeoutSeconds = &timeout
		}
	}
}

// validateService is Kubernetes' validation of the Service fields Skiff acts on: type, ports, traffic
// policies, session affinity, ExternalName and the selector. What the service proxy cannot program must be
// refused here, not dropped on the node.
func validateService(o runtime.Object) field.ErrorList {
	svc := o.(*corev1.Service)
	spec := field.NewPath("spec")
	var errs field.ErrorList
	types := []corev1.ServiceType{corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer, corev1.ServiceTypeExternalName}
	if !slices.Contains(types, svc.Spec.Type) {
		errs = append(errs, field.NotSupported(spec.Child("type"), svc.Spec.Type, types))
	}
	headless := svc.Spec.ClusterIP == corev1.ClusterIPNone
	if svc.Spec.Type == corev1.ServiceTypeExternalName {
		if svc.Spec.ExternalName == "" {
			errs = append(errs, field.Required(spec.Child("externalName"), ""))
		} else if msgs := validation.IsDNS1123Subdomain(strings.TrimSuffix(svc.Spec.ExternalName, ".")); len(msgs) > 0 {
			errs = append(errs, field.Invalid(spec.Child("externalName"), svc.Spec.ExternalName, strings.Join(msgs, "; ")))
		}
		if svc.Spec.ClusterIP != "" {
			errs = append(errs, field.Forbidden(spec.Child("clusterIP"), "may not be set for ExternalName services"))
		}
	} else if len(svc.Spec.Ports) == 0 && !headless {
		errs = append(errs, field.Required(spec.Child("ports"), ""))
	}
	if headless && hasNodePorts(svc) {
		errs = append(errs, field.Invalid(spec.Child("clusterIPs").Index(0), svc.Spec.ClusterIP, "may not be set to 'None' for NodePort services"))
	}
	names, seen := map[string]bool{}, map[string]bool{}
	protocols := []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP}
	for i, p := range svc.Spec.Ports {
		path := spec.Child("ports").Index(i)
		switch {
		case p.Name == "" && len(svc.Spec.Ports) > 1:
			errs = append(errs, field.Required(path.Child("name"), ""))
		case p.Name != "" && names[p.Name]:
			errs = append(errs, field.Duplicate(path.Child("name"), p.Name))
		case p.Name != "":
			for _, msg := range validation.IsDNS1123Label(p.Name) {
				errs = append(errs, field.Invalid(path.Child("name"), p.Name, msg))
			}
		}
		names[p.Name] = true
		for _, msg := range validation.IsValidPortNum(int(p.Port)) {
			errs = append(errs, field.Invalid(path.Child("port"), p.Port, msg))
		}
		if !slices.Contains(protocols, p.Protocol) {
			errs = append(errs, field.NotSupported(path.Child("protocol"), p.Protocol, protocols))
		}
		if key := fmt.Sprintf("%d/%s", p.Port, p.Protocol); seen[key] {
			errs = append(errs, field.Duplicate(path, key))
		} else {
			seen[key] = true
		}
		if p.TargetPort.Type == intstr.String {
			for _, msg := range validation.IsValidPortName(p.TargetPort.StrVal) {
				errs = append(errs, field.Invalid(path.Child("targetPort"), p.TargetPort.StrVal, msg))
			}
		} else {
			for _, msg := range validation.IsValidPortNum(int(p.TargetPort.IntVal)) {
				errs = append(errs, field.Invalid(path.Child("targetPort"), p.TargetPort.IntVal, msg))
			}
		}
		if p.NodePort != 0 && !hasNodePorts(svc) {
			errs = append(errs, field.Forbidden(path.Child("nodePort"), fmt.Sprintf("may not be used when `type` is '%s'", svc.Spec.Type)))
		}
	}
	affinities := []corev1.ServiceAffinity{corev1.ServiceAffinityNone, corev1.ServiceAffinityClientIP}
	if !slices.Contains(affinities, svc.Spec.SessionAffinity) {
		errs = append(errs, field.NotSupported(spec.Child("sessionAffinity"), svc.Spec.SessionAffinity, affinities))
	}
	if c := svc.Spec.SessionAffinityConfig; c != nil && c.ClientIP != nil && c.ClientIP.TimeoutSeconds != nil {
		path := spec.Child("sessionAffinityConfig", "clientIP", "timeoutSeconds")
		if t := *c.ClientIP.TimeoutSeconds; svc.Spec.SessionAffinity != corev1.ServiceAffinityClientIP {
			errs = append(errs, field.Forbidden(path, "must not be set when `sessionAffinity` is None"))
		} else if t <= 0 || t > maxClientIPAffinitySeconds {
			errs = append(errs, field.Invalid(path, t, fmt.Sprintf("must be greater than 0 and less than or equal to %d", maxClientIPAffinitySeconds)))
		}
	}
	if p := svc.Spec.ExternalTrafficPolicy; p != "" {
		policies := []corev1.ServiceExternalTrafficPolicy{corev1.ServiceExternalTrafficPolicyCluster, corev1.ServiceExternalTrafficPolicyLocal}
		if !hasNodePorts(svc) && len(svc.Spec.ExternalIPs) == 0 {
			errs = append(errs, field.Invalid(spec.Child("externalTrafficPolicy"), p, "may only be set for externally-accessible services"))
		} else if !slices.Contains(policies, p) {
			errs = append(errs, field.NotSupported(spec.Child("externalTrafficPolicy"), p, policies))
		}
	}
	if p := svc.Spec.InternalTrafficPolicy; p != nil {
		policies := []corev1.ServiceInternalTrafficPolicy{corev1.ServiceInternalTrafficPolicyCluster, corev1.ServiceInternalTrafficPolicyLocal}
		if !slices.Contains(policies, *p) {
			errs = append(errs, field.NotSupported(spec.Child("internalTrafficPolicy"), *p, policies))
		}
	}
	for i, ip := range svc.Spec.ExternalIPs {
		path := spec.Child("externalIPs").Index(i)
		if ipErrs := corevalidation.IsValidIPForLegacyField(path, ip, nil); len(ipErrs) > 0 {
			errs = append(errs, ipErrs...)
		} else {
			errs = append(errs, corevalidation.ValidateEndpointIP(ip, path)...)
		}
	}
	errs = append(errs, validateLoadBalancerFields(svc)...)
	// The REST layer allocates the port before validation runs (services.go), so a Service that needs one
	// has one unless allocation failed.
	if needsHealthCheckNodePort(svc) {
		if svc.Spec.HealthCheckNodePort <= 0 {
			errs = append(errs, field.Required(spec.Child("healthCheckNodePort"), "must be set when externalTrafficPolicy is 'Local'"))
		}
	} else if svc.Spec.HealthCheckNodePort != 0 {
		errs = append(errs, field.Invalid(spec.Child("healthCheckNodePort"), svc.Spec.HealthCheckNodePort,
			"may only be set when `type` is 'LoadBalancer' and `externalTrafficPolicy` is 'Local'"))
	}
	errs = append(errs, metav1validation.ValidateLabels(svc.Spec.Selector, spec.Child("selector"))...)
	return errs
}

var serviceColumns = []column{
	nameColumn,
	{name: "Type", typ: "string", value: func(o runtime.Object) interface{} { return string(o.(*corev1.Service).Spec.Type) }},
	{name: "Cluster-IP", typ: "string", value: func(o runtime.Object) interface{} { return noneIfEmpty(o.(*corev1.Service).Spec.ClusterIP) }},
	{name: "External-IP", typ: "string", value: func(o runtime.Object) interface{} { return serviceExternalIP(o.(*corev1.Service)) }},
	{name: "Port(s)", typ: "string", value: servicePorts},
	ageColumn,
	{name: "Selector", typ: "string", priority: 1, value: func(o runtime.Object) interface{} {
		return noneIfEmpty(labelsString(o.(*corev1.Service).Spec.Selector))
	}},
}

func servicePorts(o runtime.Object) interface{} {
	var parts []string
	for _, p := range o.(*corev1.Service).Spec.Ports {
		if p.NodePort != 0 {
			parts = append(parts, fmt.Sprintf("%d:%d/%s", p.Port, p.NodePort, p.Protocol))
		} else {
			parts = append(parts, fmt.Sprintf("%d/%s", p.Port, p.Protocol))
		}
	}
	return noneIfEmpty(strings.Join(parts, ","))
}

func noneIfEmpty(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

func labelsString(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + m[k]
	}
	return strings.Join(parts, ",")
}

// Events.

// eventFields are kube-apiserver's: "source" is the source component, or the reporting controller of an
// event written through events.k8s.io, which has no source.
func eventFields(o runtime.Object) fields.Set {
	e := o.(*corev1.Event)
	source := e.Source.Component
	if source == "" {
		source = e.ReportingController
	}
	return fields.Set{
		"involvedObject.kind": e.InvolvedObject.Kind, "involvedObject.namespace": e.InvolvedObject.Namespace,
		"involvedObject.name": e.InvolvedObject.Name, "involvedObject.uid": string(e.InvolvedObject.UID),
		"involvedObject.apiVersion": e.InvolvedObject.APIVersion, "involvedObject.resourceVersion": e.InvolvedObject.ResourceVersion,
		"involvedObject.fieldPath": e.InvolvedObject.FieldPath, "reason": e.Reason, "reportingComponent": e.ReportingController,
		"source": source, "type": e.Type,
	}
}

// eventsV1Fields are the attributes of an events.k8s.io/v1 Event, under the core Event's field names, to
// which Kubernetes' field label conversion maps that group's selectors (regarding.name is
// involvedObject.name, reportingController is reportingComponent).
func eventsV1Fields(o runtime.Object) fields.Set {
	e := o.(*eventsv1.Event)
	return fields.Set{
		"involvedObject.kind": e.Regarding.Kind, "involvedObject.namespace": e.Regarding.Namespace,
		"involvedObject.name": e.Regarding.Name, "involvedObject.uid": string(e.Regarding.UID),
		"involvedObject.apiVersion": e.Regarding.APIVersion, "involvedObject.resourceVersion": e.Regarding.ResourceVersion,
		"involvedObject.fieldPath": e.Regarding.FieldPath, "reason": e.Reason, "reportingComponent": e.ReportingController,
		"type": e.Type,
	}
}

var eventColumns = []column{
	{name: "Last Seen", typ: "string", value: func(o runtime.Object) interface{} {
		e := o.(*corev1.Event)
		t := e.LastTimestamp
		if t.IsZero() {
			t = metav1.Time{Time: e.EventTime.Time}
		}
		if t.IsZero() {
			t = e.CreationTimestamp
		}
		return age(t)
	}},
	{name: "Type", typ: "string", value: func(o runtime.Object) interface{} { return o.(*corev1.Event).Type }},
	{name: "Reason", typ: "string", value: func(o runtime.Object) interface{} { return o.(*corev1.Event).Reason }},
	{name: "Object", typ: "string", value: func(o runtime.Object) interface{} {
		ref := o.(*corev1.Event).InvolvedObject
		return strings.ToLower(ref.Kind) + "/" + ref.Name
	}},
	{name: "Message", typ: "string", value: func(o runtime.Object) interface{} { return strings.TrimSpace(o.(*corev1.Event).Message) }},
}

// Nodes.

func nodeFields(o runtime.Object) fields.Set {
	return fields.Set{"spec.unschedulable": fmt.Sprint(o.(*corev1.Node).Spec.Unschedulable)}
}

var nodeColumns = []column{
	nameColumn,
	{name: "Status", typ: "string", value: func(o runtime.Object) interface{} {
		n := o.(*corev1.Node)
		status := "Unknown"
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeReady {
				switch c.Status {
				case corev1.ConditionTrue:
					status = "Ready"
				case corev1.ConditionFalse:
					status = "NotReady"
				}
			}
		}
		if n.Spec.Unschedulable {
			status += ",SchedulingDisabled"
		}
		return status
	}},
	{name: "Roles", typ: "string", value: func(o runtime.Object) interface{} {
		var roles []string
		for l := range o.(*corev1.Node).Labels {
			if r, ok := strings.CutPrefix(l, "node-role.kubernetes.io/"); ok {
				roles = append(roles, r)
			}
		}
		sort.Strings(roles)
		return noneIfEmpty(strings.Join(roles, ","))
	}},
	ageColumn,
	{name: "Version", typ: "string", value: func(o runtime.Object) interface{} { return o.(*corev1.Node).Status.NodeInfo.KubeletVersion }},
	{name: "Internal-IP", typ: "string", priority: 1, value: func(o runtime.Object) interface{} {
		for _, a := range o.(*corev1.Node).Status.Addresses {
			if a.Type == corev1.NodeInternalIP {
				return a.Address
			}
		}
		return "<none>"
	}},
}

// maxClientIPAffinitySeconds is Kubernetes' cap on sessionAffinityConfig.clientIP.timeoutSeconds (a day).
const maxClientIPAffinitySeconds = 86400

// limitRangeStrategies are kube's LimitRange strategy, with its v1 defaults.
var limitRangeStrategies = &kubeStrategies{
	internal: func() runtime.Object { return &core.LimitRange{} },
	main:     limitrangeregistry.Strategy,
}

// resourceQuotaColumns are `kubectl get quota`'s columns, as kube-apiserver prints them: used/hard of each
// resource, the limits.* ones under LIMIT and the others under REQUEST.
var resourceQuotaColumns = []column{
	nameColumn,
	ageColumn,
	{name: "Request", typ: "string", value: func(o runtime.Object) any { return quotaUsage(o.(*corev1.ResourceQuota), false) }},
	{name: "Limit", typ: "string", value: func(o runtime.Object) any { return quotaUsage(o.(*corev1.ResourceQuota), true) }},
}

func quotaUsage(rq *corev1.ResourceQuota, limits bool) string {
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(rq.Status.Hard)) {
		if strings.HasPrefix(string(name), "limits.") != limits {
			continue
		}
		used := rq.Status.Used[name]
		hard := rq.Status.Hard[name]
		parts = append(parts, fmt.Sprintf("%s: %s/%s", name, used.String(), hard.String()))
	}
	return strings.Join(parts, ", ")
}
