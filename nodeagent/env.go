package nodeagent

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/api/validate/content"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	v1helper "k8s.io/kubernetes/pkg/apis/core/v1/helper"
	"k8s.io/kubernetes/pkg/kubelet/envvars"

	"github.com/skiff-dev/skiff/internal/servicecidr"
)

// containerEnv resolves a container's env and envFrom into "NAME=value" strings in Kubernetes' order and
// precedence (envFrom first, in order, with prefix; then env, later wins; $(VAR) expansion of earlier vars as
// Kubernetes does, with $$ escaping). valueFrom: configMapKeyRef, secretKeyRef (optional honoured), fieldRef
// (metadata.name, metadata.namespace, metadata.uid, metadata.labels['k'], metadata.annotations['k'],
// spec.nodeName, spec.serviceAccountName, status.hostIP, status.hostIPs, status.podIP, status.podIPs),
// resourceFieldRef (limits.cpu/memory/ephemeral-storage, requests.*, with divisor; limits default to node
// allocatable, which is passed in, or to the pod-level limits). The pod passed in has status.podIP/hostIP already filled in.
//
// Each name appears once, where it was first defined, with its last value. Values of env (not of envFrom)
// are expanded: $(VAR) is replaced by an earlier variable's value and left as is when there is none, and $$
// is a literal $. A missing ConfigMap or Secret that is not optional is an error for which
// apierrors.IsNotFound holds (`configmap "x" not found`); a missing key is `couldn't find key k in ConfigMap
// ns/x`. The kubelet turns both into the container's CreateContainerConfigError and retries.
//
// services are the service variables of the kubelet (serviceEnv: KUBERNETES_SERVICE_HOST and the rest, by
// which client-go's in-cluster config finds the API, and the links of the namespace's Services): the lowest
// precedence, defined last unless the container defines them, and available to $(VAR) expansion. fileKeyRef
// is not provided by this node.
func containerEnv(ctx context.Context, pod *corev1.Pod, c *corev1.Container, get objectGetter, allocatable corev1.ResourceList, services []corev1.EnvVar) ([]string, error) {
	get = newCachingGetter(get)
	ns := pod.Namespace
	env := envList{vals: map[string]string{}, fallback: map[string]string{}}
	for _, sv := range services {
		env.fallback[sv.Name] = sv.Value
	}
	for i, ef := range c.EnvFrom {
		var data map[string]string
		switch {
		case ef.ConfigMapRef != nil:
			cm, err := getConfigMap(ctx, get, ns, ef.ConfigMapRef.Name, ef.ConfigMapRef.Optional != nil && *ef.ConfigMapRef.Optional)
			if err != nil {
				return nil, err
			}
			data = cm.Data
		case ef.SecretRef != nil:
			s, err := getSecret(ctx, get, ns, ef.SecretRef.Name, ef.SecretRef.Optional != nil && *ef.SecretRef.Optional)
			if err != nil {
				return nil, err
			}
			data = make(map[string]string, len(s.Data))
			for k, v := range s.Data {
				data[k] = string(v)
			}
		default:
			return nil, fmt.Errorf("envFrom[%d]: neither configMapRef nor secretRef is set", i)
		}
		keys := make([]string, 0, len(data))
		for k := range data {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			name := ef.Prefix + k
			if !validEnvName(name) {
				continue // as the kubelet skips them; ConfigMap and Secret keys are always valid
			}
			env.set(name, data[k])
		}
	}
	for _, ev := range c.Env {
		value := ev.Value
		switch {
		case value != "":
			value = expandVars(value, env.mapping)
		case ev.ValueFrom != nil:
			var ok bool
			var err error
			if value, ok, err = envValueFrom(ctx, pod, c, get, allocatable, ev.ValueFrom); err != nil {
				return nil, err
			} else if !ok {
				continue // an optional source or key that is missing: the variable is not set
			}
		}
		env.set(ev.Name, value)
	}
	for _, sv := range services {
		if _, defined := env.vals[sv.Name]; !defined {
			env.set(sv.Name, sv.Value)
		}
	}
	return env.list(), nil
}

// serviceEnv is the kubelet's service variables for pod (its getServiceEnvVarMap), as Kubernetes' envvars
// package writes them (FOO_SERVICE_HOST, FOO_SERVICE_PORT, FOO_PORT_80_TCP...):
//   - those of the kubernetes Service, always, whatever enableServiceLinks says (masterService; none while the
//     service CIDR is not known);
//   - unless pod.spec.enableServiceLinks is false, those of every Service of the pod's namespace, from
//     services (nil lists none). A Service of the namespace named kubernetes wins over default/kubernetes, as
//     in the kubelet.
//
// Only Services whose ClusterIP is set and not None count. Variables are in the order of the Services' names.
func serviceEnv(pod *corev1.Pod, serviceCIDR string, services corelisters.ServiceLister) ([]corev1.EnvVar, error) {
	byName := map[string]*corev1.Service{}
	if master := masterService(serviceCIDR); master != nil {
		byName[master.Name] = master
	}
	if services != nil && (pod.Spec.EnableServiceLinks == nil || *pod.Spec.EnableServiceLinks) {
		list, err := services.Services(pod.Namespace).List(labels.Everything())
		if err != nil {
			return nil, fmt.Errorf("listing the services of namespace %s for the service links: %w", pod.Namespace, err)
		}
		for _, svc := range list {
			// envvars.FromServices reads the first port; validation requires one of a ClusterIP Service.
			if v1helper.IsServiceIPSet(svc) && len(svc.Spec.Ports) > 0 {
				byName[svc.Name] = svc
			}
		}
	}
	list := make([]*corev1.Service, 0, len(byName))
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		list = append(list, byName[name])
	}
	return envvars.FromServices(list), nil
}

// masterService is the kubernetes Service as the kubelet's variables see it: its ClusterIP (the first address
// of the service CIDR) and port 443; nil when the service CIDR is not known yet.
func masterService(serviceCIDR string) *corev1.Service {
	ip, err := servicecidr.KubernetesServiceIP(serviceCIDR)
	if err != nil {
		return nil
	}
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "kubernetes", Namespace: metav1.NamespaceDefault},
		Spec:       corev1.ServiceSpec{ClusterIP: ip.String(), Ports: []corev1.ServicePort{{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP}}},
	}
}

// envValueFrom is the value of an env var's valueFrom; ok is false for a missing optional key.
func envValueFrom(ctx context.Context, pod *corev1.Pod, c *corev1.Container, get objectGetter, allocatable corev1.ResourceList, from *corev1.EnvVarSource) (value string, ok bool, err error) {
	switch {
	case from.FieldRef != nil:
		value, err = envFieldValue(pod, from.FieldRef)
		return value, err == nil, err
	case from.ResourceFieldRef != nil:
		value, err = resourceFieldValue(pod, c, from.ResourceFieldRef, envLimitDefaults(pod, allocatable))
		return value, err == nil, err
	case from.ConfigMapKeyRef != nil:
		ref := from.ConfigMapKeyRef
		optional := ref.Optional != nil && *ref.Optional
		cm, err := getConfigMap(ctx, get, pod.Namespace, ref.Name, optional)
		if err != nil {
			return "", false, err
		}
		if value, ok = cm.Data[ref.Key]; !ok && !optional {
			return "", false, fmt.Errorf("couldn't find key %v in ConfigMap %v/%v", ref.Key, pod.Namespace, ref.Name)
		}
		return value, ok, nil
	case from.SecretKeyRef != nil:
		ref := from.SecretKeyRef
		optional := ref.Optional != nil && *ref.Optional
		s, err := getSecret(ctx, get, pod.Namespace, ref.Name, optional)
		if err != nil {
			return "", false, err
		}
		data, ok := s.Data[ref.Key]
		if !ok && !optional {
			return "", false, fmt.Errorf("couldn't find key %v in Secret %v/%v", ref.Key, pod.Namespace, ref.Name)
		}
		return string(data), ok, nil
	case from.FileKeyRef != nil:
		return "", false, notSupported("fileKeyRef environment variables are not supported by this node")
	}
	return "", false, fmt.Errorf("valueFrom sets no source")
}

// envLimitDefaults is what an env var reads for a container's unset limits, as the kubelet's
// defaultPodLimitsForDownwardAPI makes it: the Node's allocatable, but the pod's own cpu and memory limits
// where its spec.resources sets them (pod-level resources). The kubelet's downwardAPI volumes do not do this:
// they use the allocatable alone.
func envLimitDefaults(pod *corev1.Pod, allocatable corev1.ResourceList) corev1.ResourceList {
	if pod.Spec.Resources == nil || len(pod.Spec.Resources.Limits) == 0 {
		return allocatable
	}
	out := allocatable.DeepCopy()
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if q, ok := pod.Spec.Resources.Limits[name]; ok && !q.IsZero() {
			if _, ok := out[name]; ok {
				out[name] = q.DeepCopy()
			}
		}
	}
	return out
}

// envList is an environment being built: names in the order first defined, last value wins.
type envList struct {
	names []string
	vals  map[string]string
	// fallback answers $(name) for a name not defined (yet): the service variables.
	fallback map[string]string
}

func (e *envList) set(name, value string) {
	if _, ok := e.vals[name]; !ok {
		e.names = append(e.names, name)
	}
	e.vals[name] = value
}

// mapping is the expansion of $(name): the variable's value, or the reference itself when there is none.
func (e *envList) mapping(name string) string {
	if v, ok := e.vals[name]; ok {
		return v
	}
	if v, ok := e.fallback[name]; ok {
		return v
	}
	return "$(" + name + ")"
}

func (e *envList) list() []string {
	out := make([]string, len(e.names))
	for i, n := range e.names {
		out[i] = n + "=" + e.vals[n]
	}
	return out
}

// validEnvName is Kubernetes' relaxed env var name: printable ASCII other than '='.
func validEnvName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; c < ' ' || c > '~' || c == '=' {
			return false
		}
	}
	return true
}

// expandVars expands $(VAR) references as Kubernetes does (third_party/forked/golang/expansion): $$ is an
// escaped $, $(VAR) is mapping(VAR), an unterminated "$(" and a $ before anything else are kept as they are.
func expandVars(input string, mapping func(string) string) string {
	var b strings.Builder
	checkpoint := 0
	for cursor := 0; cursor < len(input); cursor++ {
		if input[cursor] != '$' || cursor+1 >= len(input) {
			continue
		}
		b.WriteString(input[checkpoint:cursor])
		rest := input[cursor+1:]
		advance := 1
		switch rest[0] {
		case '$':
			b.WriteByte('$')
		case '(':
			if end := strings.IndexByte(rest, ')'); end > 0 {
				b.WriteString(mapping(rest[1:end]))
				advance = end + 1
			} else {
				b.WriteString("$(")
			}
		default:
			b.WriteByte('$')
			b.WriteByte(rest[0])
		}
		cursor += advance
		checkpoint = cursor + 1
	}
	return b.String() + input[checkpoint:]
}

// cachingGetter remembers what it fetched, so that one container or pod asks for each object once.
type cachingGetter struct {
	get        objectGetter
	configMaps map[string]cachedObject[*corev1.ConfigMap]
	secrets    map[string]cachedObject[*corev1.Secret]
}

type cachedObject[T any] struct {
	obj T
	err error
}

func newCachingGetter(get objectGetter) *cachingGetter {
	if c, ok := get.(*cachingGetter); ok {
		return c
	}
	return &cachingGetter{get: get, configMaps: map[string]cachedObject[*corev1.ConfigMap]{},
		secrets: map[string]cachedObject[*corev1.Secret]{}}
}

func (c *cachingGetter) ConfigMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error) {
	key := namespace + "/" + name
	if r, ok := c.configMaps[key]; ok {
		return r.obj, r.err
	}
	obj, err := c.get.ConfigMap(ctx, namespace, name)
	c.configMaps[key] = cachedObject[*corev1.ConfigMap]{obj, err}
	return obj, err
}

// RuntimeClass is not cached: a pod reads its class once, when its sandbox is made.
func (c *cachingGetter) RuntimeClass(ctx context.Context, name string) (*nodev1.RuntimeClass, error) {
	return c.get.RuntimeClass(ctx, name)
}

func (c *cachingGetter) Secret(ctx context.Context, namespace, name string) (*corev1.Secret, error) {
	key := namespace + "/" + name
	if r, ok := c.secrets[key]; ok {
		return r.obj, r.err
	}
	obj, err := c.get.Secret(ctx, namespace, name)
	c.secrets[key] = cachedObject[*corev1.Secret]{obj, err}
	return obj, err
}

// envFieldValue is a fieldRef of an env var, as the kubelet resolves it.
func envFieldValue(pod *corev1.Pod, fs *corev1.ObjectFieldSelector) (string, error) {
	if fs.APIVersion != "" && fs.APIVersion != "v1" {
		return "", fmt.Errorf("unsupported pod version: %s", fs.APIVersion)
	}
	switch fs.FieldPath {
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.hostIP", "status.hostIPs":
		ips := pod.Status.HostIPs
		if len(ips) == 0 && pod.Status.HostIP != "" {
			ips = []corev1.HostIP{{IP: pod.Status.HostIP}}
		}
		if len(ips) == 0 {
			return "", fmt.Errorf("%s: the pod's host IP is not known", fs.FieldPath)
		}
		if fs.FieldPath == "status.hostIP" {
			if pod.Status.HostIP != "" {
				return pod.Status.HostIP, nil
			}
			return ips[0].IP, nil
		}
		s := make([]string, len(ips))
		for i, ip := range ips {
			s[i] = ip.IP
		}
		return strings.Join(s, ","), nil
	case "status.podIP", "status.podIPs":
		ips := pod.Status.PodIPs
		if len(ips) == 0 && pod.Status.PodIP != "" {
			ips = []corev1.PodIP{{IP: pod.Status.PodIP}}
		}
		if len(ips) == 0 {
			return "", nil // a pod without an IP yet, as the kubelet gives it
		}
		if fs.FieldPath == "status.podIP" {
			return ips[0].IP, nil
		}
		s := make([]string, len(ips))
		for i, ip := range ips {
			s[i] = ip.IP
		}
		return strings.Join(s, ","), nil
	}
	return metadataFieldValue(pod, fs.FieldPath)
}

// volumeFieldValue is a fieldRef of a downwardAPI volume item: metadata only.
func volumeFieldValue(pod *corev1.Pod, fs *corev1.ObjectFieldSelector) (string, error) {
	if fs.APIVersion != "" && fs.APIVersion != "v1" {
		return "", fmt.Errorf("unsupported pod version: %s", fs.APIVersion)
	}
	return metadataFieldValue(pod, fs.FieldPath)
}

// metadataFieldValue is the kubelet's fieldpath.ExtractFieldPathAsString for a pod.
func metadataFieldValue(pod *corev1.Pod, fieldPath string) (string, error) {
	if p, key, ok := splitSubscript(fieldPath); ok {
		switch p {
		case "metadata.annotations":
			if errs := content.IsLabelKey(strings.ToLower(key)); len(errs) != 0 {
				return "", fmt.Errorf("invalid key subscript in %s: %s", fieldPath, strings.Join(errs, ";"))
			}
			return pod.Annotations[key], nil
		case "metadata.labels":
			if errs := content.IsLabelKey(key); len(errs) != 0 {
				return "", fmt.Errorf("invalid key subscript in %s: %s", fieldPath, strings.Join(errs, ";"))
			}
			return pod.Labels[key], nil
		}
		return "", fmt.Errorf("fieldPath %q does not support subscript", fieldPath)
	}
	switch fieldPath {
	case "metadata.annotations":
		return formatMap(pod.Annotations), nil
	case "metadata.labels":
		return formatMap(pod.Labels), nil
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	}
	return "", fmt.Errorf("unsupported fieldPath: %v", fieldPath)
}

// splitSubscript splits "metadata.labels['k']" into "metadata.labels" and "k".
func splitSubscript(fieldPath string) (string, string, bool) {
	s, ok := strings.CutSuffix(fieldPath, "']")
	if !ok {
		return fieldPath, "", false
	}
	p, key, ok := strings.Cut(s, "['")
	if !ok || p == "" {
		return fieldPath, "", false
	}
	return p, key, true
}

// formatMap is how the downward API writes labels and annotations: `k="v"` lines, sorted by key, values
// quoted as Go quotes them, no newline after the last.
func formatMap(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b []byte
	for i, k := range keys {
		if i > 0 {
			b = append(b, '\n')
		}
		b = append(b, k...)
		b = append(b, '=')
		b = strconv.AppendQuote(b, m[k])
	}
	return string(b)
}

// resourceFieldValue is a resourceFieldRef, of container c unless it names another container of the pod:
// the quantity divided by the divisor (default 1), rounded up. Unset or zero limits of cpu, memory and
// ephemeral-storage are the node's allocatable, as the kubelet defaults them for the downward API; unset
// requests are 0, even for a container without any.
func resourceFieldValue(pod *corev1.Pod, c *corev1.Container, fs *corev1.ResourceFieldSelector, allocatable corev1.ResourceList) (string, error) {
	target := c
	if fs.ContainerName != "" && (c == nil || c.Name != fs.ContainerName) {
		target = findContainer(pod, fs.ContainerName)
		if target == nil {
			return "", fmt.Errorf("resourceFieldRef: container %s not found", fs.ContainerName)
		}
	}
	if target == nil {
		return "", fmt.Errorf("resourceFieldRef %s: containerName is required", fs.Resource)
	}
	limits := corev1.ResourceList{}
	for name, q := range target.Resources.Limits {
		limits[name] = q
	}
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage} {
		if q, ok := limits[name]; !ok || q.IsZero() {
			if a, ok := allocatable[name]; ok {
				limits[name] = a
			}
		}
	}
	divisor := resource.MustParse("1")
	if !fs.Divisor.IsZero() {
		divisor = fs.Divisor
	}
	// A resource the container does not list reads as zero, as in the kubelet's ExtractContainerResourceValue
	// (Requests.Cpu() of a container without requests): a nil list is not an unsupported resource.
	var list corev1.ResourceList
	kind, name, _ := strings.Cut(fs.Resource, ".")
	switch kind {
	case "limits":
		list = limits
	case "requests":
		list = target.Resources.Requests
	default:
		return "", fmt.Errorf("unsupported container resource : %v", fs.Resource)
	}
	switch rn := corev1.ResourceName(name); {
	case rn == corev1.ResourceCPU:
		q := list[rn]
		return ceilDiv(q.MilliValue(), divisor.MilliValue(), fs)
	case rn == corev1.ResourceMemory, rn == corev1.ResourceEphemeralStorage, strings.HasPrefix(name, corev1.ResourceHugePagesPrefix):
		q := list[rn]
		return ceilDiv(q.Value(), divisor.Value(), fs)
	}
	return "", fmt.Errorf("unsupported container resource : %v", fs.Resource)
}

func ceilDiv(v, d int64, fs *corev1.ResourceFieldSelector) (string, error) {
	if d <= 0 {
		return "", fmt.Errorf("resourceFieldRef %s: invalid divisor %s", fs.Resource, fs.Divisor.String())
	}
	q := v / d
	if v%d != 0 && v > 0 {
		q++
	}
	return strconv.FormatInt(q, 10), nil
}

func findContainer(pod *corev1.Pod, name string) *corev1.Container {
	for _, list := range [][]corev1.Container{pod.Spec.Containers, pod.Spec.InitContainers} {
		for i := range list {
			if list[i].Name == name {
				return &list[i]
			}
		}
	}
	return nil
}
