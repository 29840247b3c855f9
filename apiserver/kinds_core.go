package apiserver

import (
	"fmt"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
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

// Services.

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
}

var serviceColumns = []column{
	nameColumn,
	{name: "Type", typ: "string", value: func(o runtime.Object) interface{} { return string(o.(*corev1.Service).Spec.Type) }},
	{name: "Cluster-IP", typ: "string", value: func(o runtime.Object) interface{} { return noneIfEmpty(o.(*corev1.Service).Spec.ClusterIP) }},
	{name: "External-IP", typ: "string", value: func(o runtime.Object) interface{} {
		return noneIfEmpty(strings.Join(o.(*corev1.Service).Spec.ExternalIPs, ","))
	}},
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

func eventFields(o runtime.Object) fields.Set {
	e := o.(*corev1.Event)
	return fields.Set{
		"involvedObject.kind": e.InvolvedObject.Kind, "involvedObject.namespace": e.InvolvedObject.Namespace,
		"involvedObject.name": e.InvolvedObject.Name, "involvedObject.uid": string(e.InvolvedObject.UID),
		"involvedObject.apiVersion": e.InvolvedObject.APIVersion, "involvedObject.resourceVersion": e.InvolvedObject.ResourceVersion,
		"involvedObject.fieldPath": e.InvolvedObject.FieldPath, "reason": e.Reason, "reportingComponent": e.ReportingController,
		"source": e.Source.Component, "type": e.Type,
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
