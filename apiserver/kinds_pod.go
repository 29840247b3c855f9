package apiserver

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilsysctl "k8s.io/component-helpers/node/util/sysctl"
	corevalidation "k8s.io/kubernetes/pkg/apis/core/validation"
)

// defaultPod applies the defaults Kubernetes applies to a pod.
func defaultPod(o runtime.Object) {
	pod := o.(*corev1.Pod)
	spec := &pod.Spec
	if spec.RestartPolicy == "" {
		spec.RestartPolicy = corev1.RestartPolicyAlways
	}
	if spec.TerminationGracePeriodSeconds == nil {
		grace := int64(corev1.DefaultTerminationGracePeriodSeconds)
		spec.TerminationGracePeriodSeconds = &grace
	}
	if spec.DNSPolicy == "" {
		spec.DNSPolicy = corev1.DNSClusterFirst
	}
	if spec.SchedulerName == "" {
		spec.SchedulerName = corev1.DefaultSchedulerName
	}
	if spec.ServiceAccountName == "" {
		spec.ServiceAccountName = "default"
	}
	if spec.EnableServiceLinks == nil {
		enable := corev1.DefaultEnableServiceLinks
		spec.EnableServiceLinks = &enable
	}
	if spec.SecurityContext == nil {
		spec.SecurityContext = &corev1.PodSecurityContext{}
	}
	for _, list := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for i := range list {
			defaultContainer(&list[i])
		}
	}
	for i := range spec.Volumes {
		v := &spec.Volumes[i]
		if v.ConfigMap != nil && v.ConfigMap.DefaultMode == nil {
			mode := corev1.ConfigMapVolumeSourceDefaultMode
			v.ConfigMap.DefaultMode = &mode
		}
		if v.Secret != nil && v.Secret.DefaultMode == nil {
			mode := corev1.SecretVolumeSourceDefaultMode
			v.Secret.DefaultMode = &mode
		}
		if v.Image != nil && v.Image.PullPolicy == "" {
			// As a container's image: Always for :latest or no tag, IfNotPresent otherwise.
			v.Image.PullPolicy = corev1.PullIfNotPresent
			if tag := imageTag(v.Image.Reference); tag == "" || tag == "latest" {
				v.Image.PullPolicy = corev1.PullAlways
			}
		}
	}
}

// defaultRequestsFromLimits gives each container a request for every resource it has a limit for and no
// request, equal to the limit, as Kubernetes defaults a pod (not a pod template).
func defaultRequestsFromLimits(pod *corev1.Pod) {
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			r := &list[i].Resources
			for name, q := range r.Limits {
				if _, ok := r.Requests[name]; !ok {
					if r.Requests == nil {
						r.Requests = corev1.ResourceList{}
					}
					r.Requests[name] = q.DeepCopy()
				}
			}
		}
	}
}

func defaultContainer(c *corev1.Container) {
	if c.ImagePullPolicy == "" {
		c.ImagePullPolicy = corev1.PullIfNotPresent
		if imageTag(c.Image) == "" || imageTag(c.Image) == "latest" {
			c.ImagePullPolicy = corev1.PullAlways
		}
	}
	if c.TerminationMessagePath == "" {
		c.TerminationMessagePath = corev1.TerminationMessagePathDefault
	}
	if c.TerminationMessagePolicy == "" {
		c.TerminationMessagePolicy = corev1.TerminationMessageReadFile
	}
	for i := range c.Ports {
		if c.Ports[i].Protocol == "" {
			c.Ports[i].Protocol = corev1.ProtocolTCP
		}
	}
}

// imageTag returns the tag of an image reference ("" when it has none or only a digest).
func imageTag(image string) string {
	if strings.Contains(image, "@") {
		return "digest"
	}
	slash := strings.LastIndex(image, "/")
	if colon := strings.LastIndex(image, ":"); colon > slash {
		return image[colon+1:]
	}
	return ""
}

// preparePodCreate sets the status a new pod starts with.
func preparePodCreate(o runtime.Object) {
	pod := o.(*corev1.Pod)
	pod.Status = corev1.PodStatus{Phase: corev1.PodPending, QOSClass: qosClass(pod)}
}

func qosClass(pod *corev1.Pod) corev1.PodQOSClass {
	requests, limits, guaranteed := 0, 0, true
	for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		requests += len(c.Resources.Requests)
		limits += len(c.Resources.Limits)
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			l, hasLimit := c.Resources.Limits[r]
			q, hasReq := c.Resources.Requests[r]
			if !hasLimit || (hasReq && q.Cmp(l) != 0) {
				guaranteed = false
			}
		}
	}
	switch {
	case requests == 0 && limits == 0:
		return corev1.PodQOSBestEffort
	case guaranteed:
		return corev1.PodQOSGuaranteed
	}
	return corev1.PodQOSBurstable
}

// supportedVolume names the volume source a volume uses, or "" for one Skiff does not implement.
func supportedVolume(v corev1.Volume) string {
	switch {
	case v.EmptyDir != nil:
		return "emptyDir"
	case v.ConfigMap != nil:
		return "configMap"
	case v.Secret != nil:
		return "secret"
	case v.HostPath != nil:
		return "hostPath"
	case v.Projected != nil:
		return "projected"
	case v.DownwardAPI != nil:
		return "downwardAPI"
	case v.PersistentVolumeClaim != nil:
		return "persistentVolumeClaim"
	case v.Image != nil:
		return "image"
	case v.CSI != nil:
		// Served: a node with no driver of that name keeps the pod waiting with a FailedMount event, as the
		// kubelet does (Skiff's agents run no CSI drivers).
		return "csi"
	}
	return ""
}

var supportedVolumeTypes = []string{"emptyDir", "configMap", "secret", "hostPath", "projected", "downwardAPI", "persistentVolumeClaim", "image", "csi"}

func validatePod(o runtime.Object) field.ErrorList {
	pod := o.(*corev1.Pod)
	spec := field.NewPath("spec")
	var errs field.ErrorList
	if len(pod.Spec.Containers) == 0 {
		errs = append(errs, field.Required(spec.Child("containers"), "a pod needs at least one container"))
	}
	volumes := sets.New[string]()
	for i, v := range pod.Spec.Volumes {
		p := spec.Child("volumes").Index(i)
		for _, msg := range validation.IsDNS1123Label(v.Name) {
			errs = append(errs, field.Invalid(p.Child("name"), v.Name, msg))
		}
		if volumes.Has(v.Name) {
			errs = append(errs, field.Duplicate(p.Child("name"), v.Name))
		}
		volumes.Insert(v.Name)
		if supportedVolume(v) == "" {
			errs = append(errs, field.NotSupported(p, volumeTypeName(v), supportedVolumeTypes))
		}
		if img := v.Image; img != nil {
			if img.Reference == "" {
				errs = append(errs, field.Required(p.Child("image", "reference"), ""))
			}
			switch img.PullPolicy {
			case corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
			default:
				errs = append(errs, field.NotSupported(p.Child("image", "pullPolicy"), img.PullPolicy, []corev1.PullPolicy{corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever}))
			}
		}
		if csi := v.CSI; csi != nil {
			errs = append(errs, corevalidation.ValidateCSIDriverName(csi.Driver, p.Child("csi", "driver"))...)
			if ref := csi.NodePublishSecretRef; ref != nil && ref.Name == "" {
				errs = append(errs, field.Required(p.Child("csi", "nodePublishSecretRef", "name"), ""))
			}
		}
		if c := v.PersistentVolumeClaim; c != nil {
			if c.ClaimName == "" {
				errs = append(errs, field.Required(p.Child("persistentVolumeClaim", "claimName"), ""))
			}
			for _, msg := range validation.IsDNS1123Subdomain(c.ClaimName) {
				if c.ClaimName != "" {
					errs = append(errs, field.Invalid(p.Child("persistentVolumeClaim", "claimName"), c.ClaimName, msg))
				}
			}
		}
	}
	errs = append(errs, validateCertificateProjections(pod, spec.Child("volumes"))...)
	names := sets.New[string]()
	for _, group := range []struct {
		path *field.Path
		list []corev1.Container
	}{{spec.Child("initContainers"), pod.Spec.InitContainers}, {spec.Child("containers"), pod.Spec.Containers}} {
		for i, c := range group.list {
			errs = append(errs, validateContainer(c, group.path.Index(i), names, volumes)...)
			nonSidecarInit := group.path.String() == "spec.initContainers" && !isRestartable(&c)
			errs = append(errs, validateResizePolicy(c, pod.Spec.RestartPolicy, nonSidecarInit, group.path.Index(i).Child("resizePolicy"))...)
		}
	}
	switch pod.Spec.RestartPolicy {
	case corev1.RestartPolicyAlways, corev1.RestartPolicyOnFailure, corev1.RestartPolicyNever:
	default:
		errs = append(errs, field.NotSupported(spec.Child("restartPolicy"), pod.Spec.RestartPolicy,
			[]corev1.RestartPolicy{corev1.RestartPolicyAlways, corev1.RestartPolicyOnFailure, corev1.RestartPolicyNever}))
	}
	if g := pod.Spec.TerminationGracePeriodSeconds; g != nil && *g < 0 {
		errs = append(errs, field.Invalid(spec.Child("terminationGracePeriodSeconds"), *g, "must be >= 0"))
	}
	if sc := pod.Spec.SecurityContext; sc != nil {
		errs = append(errs, validateSysctls(sc.Sysctls, &pod.Spec, spec.Child("securityContext", "sysctls"))...)
	}
	return errs
}

// validateResizePolicy is kube-apiserver's check of a container's resize policies: cpu and memory, each at
// most once, NotRequired or RestartContainer, and only NotRequired in a pod that never restarts a container
// (or for an init container that is not a sidecar).
func validateResizePolicy(c corev1.Container, podPolicy corev1.RestartPolicy, nonSidecarInit bool, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	seen := sets.New[corev1.ResourceName]()
	for i, rp := range c.ResizePolicy {
		if seen.Has(rp.ResourceName) {
			errs = append(errs, field.Duplicate(p.Index(i), rp.ResourceName))
		}
		seen.Insert(rp.ResourceName)
		switch rp.ResourceName {
		case corev1.ResourceCPU, corev1.ResourceMemory:
		case "":
			errs = append(errs, field.Required(p.Index(i).Child("resourceName"), ""))
		default:
			errs = append(errs, field.NotSupported(p.Index(i).Child("resourceName"), rp.ResourceName, []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory}))
		}
		switch rp.RestartPolicy {
		case corev1.NotRequired, corev1.RestartContainer:
		case "":
			errs = append(errs, field.Required(p.Index(i).Child("restartPolicy"), ""))
		default:
			errs = append(errs, field.NotSupported(p.Index(i).Child("restartPolicy"), rp.RestartPolicy, []corev1.ResourceResizeRestartPolicy{corev1.NotRequired, corev1.RestartContainer}))
		}
		switch {
		case rp.RestartPolicy == corev1.RestartContainer && nonSidecarInit:
			errs = append(errs, field.Invalid(p.Index(i).Child("restartPolicy"), rp.RestartPolicy, "must not be set to 'RestartContainer' for non-sidecar initContainers"))
		case rp.RestartPolicy == corev1.RestartContainer && podPolicy == corev1.RestartPolicyNever:
			errs = append(errs, field.Invalid(p.Index(i).Child("restartPolicy"), rp.RestartPolicy, "must be 'NotRequired' when pod `restartPolicy` is 'Never'"))
		}
	}
	return errs
}

// validateSysctls is kube-apiserver's check of a pod's sysctls: valid, unique names, and no network (IPC)
// sysctl in a pod sharing the host's network (IPC) namespace. Which sysctls a node allows is the node's
// admission (SysctlForbidden), not the API's.
func validateSysctls(sysctls []corev1.Sysctl, spec *corev1.PodSpec, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	names := sets.New[string]()
	for i, s := range sysctls {
		np := p.Index(i).Child("name")
		switch {
		case s.Name == "":
			errs = append(errs, field.Required(np, ""))
		case !corevalidation.IsValidSysctlName(s.Name):
			errs = append(errs, field.Invalid(np, s.Name, fmt.Sprintf("must have at most %d characters and match regex ^%s$",
				corevalidation.SysctlMaxLength, corevalidation.SysctlContainSlashFmt)))
		case names.Has(s.Name):
			errs = append(errs, field.Duplicate(np, s.Name))
		}
		names.Insert(s.Name)
		switch ns, _, _ := utilsysctl.GetNamespace(s.Name); {
		case spec.HostNetwork && ns == utilsysctl.NetNamespace:
			errs = append(errs, field.Invalid(np, s.Name, "may not be specified when 'hostNetwork' is true"))
		case spec.HostIPC && ns == utilsysctl.IPCNamespace:
			errs = append(errs, field.Invalid(np, s.Name, "may not be specified when 'hostIPC' is true"))
		}
	}
	return errs
}

// preparePodUpdate keeps ephemeral containers: only the ephemeralcontainers subresource changes them.
func preparePodUpdate(o, old runtime.Object) {
	o.(*corev1.Pod).Spec.EphemeralContainers = old.(*corev1.Pod).Spec.EphemeralContainers
}

// validatePodCreate holds the rules that apply to new pods only.
func validatePodCreate(o runtime.Object) field.ErrorList {
	if o.(*corev1.Pod).Spec.EphemeralContainers != nil {
		return field.ErrorList{field.Forbidden(field.NewPath("spec", "ephemeralContainers"), "cannot be set on create; add ephemeral containers through the ephemeralcontainers subresource")}
	}
	return nil
}

// volumeTypeName names the source set on a volume Skiff does not support, for the error message.
func volumeTypeName(v corev1.Volume) string {
	switch {
	case v.NFS != nil:
		return "nfs"
	case v.CSI != nil:
		return "csi"
	case v.Ephemeral != nil:
		return "ephemeral"
	case v.Image != nil:
		return "image"
	}
	return "unknown volume source"
}

func validateContainer(c corev1.Container, p *field.Path, names, volumes sets.Set[string]) field.ErrorList {
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Label(c.Name) {
		errs = append(errs, field.Invalid(p.Child("name"), c.Name, msg))
	}
	if names.Has(c.Name) {
		errs = append(errs, field.Duplicate(p.Child("name"), c.Name))
	}
	names.Insert(c.Name)
	if strings.TrimSpace(c.Image) == "" {
		errs = append(errs, field.Required(p.Child("image"), ""))
	}
	for i, port := range c.Ports {
		pp := p.Child("ports").Index(i)
		for _, msg := range validation.IsValidPortNum(int(port.ContainerPort)) {
			errs = append(errs, field.Invalid(pp.Child("containerPort"), port.ContainerPort, msg))
		}
		if port.HostPort != 0 {
			for _, msg := range validation.IsValidPortNum(int(port.HostPort)) {
				errs = append(errs, field.Invalid(pp.Child("hostPort"), port.HostPort, msg))
			}
		}
		switch port.Protocol {
		case corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP:
		default:
			errs = append(errs, field.NotSupported(pp.Child("protocol"), port.Protocol, []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP}))
		}
	}
	for name, limit := range c.Resources.Limits {
		if req, ok := c.Resources.Requests[name]; ok && req.Cmp(limit) > 0 {
			errs = append(errs, field.Invalid(p.Child("resources", "requests").Key(string(name)), req.String(),
				fmt.Sprintf("must be less than or equal to %s limit of %s", name, limit.String())))
		}
	}
	for _, group := range []struct {
		name string
		list corev1.ResourceList
	}{{"limits", c.Resources.Limits}, {"requests", c.Resources.Requests}} {
		for name, q := range group.list {
			if q.Sign() < 0 {
				errs = append(errs, field.Invalid(p.Child("resources", group.name).Key(string(name)), q.String(), "must be greater than or equal to 0"))
			}
		}
	}
	for i, m := range c.VolumeMounts {
		mp := p.Child("volumeMounts").Index(i)
		if !volumes.Has(m.Name) {
			errs = append(errs, field.NotFound(mp.Child("name"), m.Name))
		}
		if m.MountPath == "" {
			errs = append(errs, field.Required(mp.Child("mountPath"), ""))
		}
	}
	for _, probe := range []struct {
		name string
		p    *corev1.Probe
	}{{"livenessProbe", c.LivenessProbe}, {"readinessProbe", c.ReadinessProbe}, {"startupProbe", c.StartupProbe}} {
		if probe.p == nil {
			continue
		}
		h := probe.p.ProbeHandler
		n := 0
		for _, set := range []bool{h.Exec != nil, h.HTTPGet != nil, h.TCPSocket != nil, h.GRPC != nil} {
			if set {
				n++
			}
		}
		if n != 1 {
			errs = append(errs, field.Invalid(p.Child(probe.name), "", "must specify exactly one of exec, httpGet, tcpSocket or grpc"))
		}
		if g := h.GRPC; g != nil {
			for _, msg := range validation.IsValidPortNum(int(g.Port)) {
				errs = append(errs, field.Invalid(p.Child(probe.name, "grpc", "port"), g.Port, msg))
			}
			if m := g.Mode; m != nil && *m != corev1.GRPCProbeModePlaintext && *m != corev1.GRPCProbeModeTLS {
				errs = append(errs, field.NotSupported(p.Child(probe.name, "grpc", "mode"), *m, []corev1.GRPCProbeMode{corev1.GRPCProbeModePlaintext, corev1.GRPCProbeModeTLS}))
			}
		}
	}
	return errs
}

// validatePodUpdate enforces that a pod's spec is immutable except where Kubernetes allows changes:
// container images, activeDeadlineSeconds, and added tolerations.
func validatePodUpdate(o, old runtime.Object) field.ErrorList {
	pod, oldPod := o.(*corev1.Pod), old.(*corev1.Pod)
	mutated := oldPod.Spec.DeepCopy()
	for i := range mutated.Containers {
		if i < len(pod.Spec.Containers) {
			mutated.Containers[i].Image = pod.Spec.Containers[i].Image
		}
	}
	for i := range mutated.InitContainers {
		if i < len(pod.Spec.InitContainers) {
			mutated.InitContainers[i].Image = pod.Spec.InitContainers[i].Image
		}
	}
	mutated.ActiveDeadlineSeconds = pod.Spec.ActiveDeadlineSeconds
	if onlyAddedTolerations(pod.Spec.Tolerations, oldPod.Spec.Tolerations) {
		mutated.Tolerations = pod.Spec.Tolerations
	}
	if !apiequality.Semantic.DeepEqual(mutated, &pod.Spec) {
		return field.ErrorList{field.Forbidden(field.NewPath("spec"),
			"pod updates may not change fields other than `spec.containers[*].image`, `spec.initContainers[*].image`, `spec.activeDeadlineSeconds` or `spec.tolerations` (only additions to existing tolerations)")}
	}
	return nil
}

// onlyAddedTolerations is kube-apiserver's rule for a pod update's tolerations: every old toleration is still
// there, in any order, changed at most in its tolerationSeconds.
func onlyAddedTolerations(cur, old []corev1.Toleration) bool {
	for _, o := range old {
		found := false
		for _, c := range cur {
			o.TolerationSeconds = c.TolerationSeconds
			if apiequality.Semantic.DeepEqual(o, c) {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func podFields(o runtime.Object) fields.Set {
	pod := o.(*corev1.Pod)
	return fields.Set{
		"spec.nodeName": pod.Spec.NodeName, "status.phase": string(pod.Status.Phase), "spec.schedulerName": pod.Spec.SchedulerName,
		"spec.restartPolicy": string(pod.Spec.RestartPolicy), "spec.serviceAccountName": pod.Spec.ServiceAccountName,
		"status.podIP": pod.Status.PodIP, "status.nominatedNodeName": pod.Status.NominatedNodeName,
	}
}

var podColumns = []column{
	nameColumn,
	{name: "Ready", typ: "string", value: func(o runtime.Object) interface{} {
		pod := o.(*corev1.Pod)
		ready := 0
		for _, cs := range pod.Status.ContainerStatuses {
			if cs.Ready {
				ready++
			}
		}
		return fmt.Sprintf("%d/%d", ready, len(pod.Spec.Containers))
	}},
	{name: "Status", typ: "string", value: func(o runtime.Object) interface{} { return podStatus(o.(*corev1.Pod)) }},
	{name: "Restarts", typ: "string", value: func(o runtime.Object) interface{} {
		var n int32
		for _, cs := range o.(*corev1.Pod).Status.ContainerStatuses {
			n += cs.RestartCount
		}
		return fmt.Sprint(n)
	}},
	ageColumn,
	{name: "IP", typ: "string", priority: 1, value: func(o runtime.Object) interface{} { return noneIfEmpty(o.(*corev1.Pod).Status.PodIP) }},
	{name: "Node", typ: "string", priority: 1, value: func(o runtime.Object) interface{} { return noneIfEmpty(o.(*corev1.Pod).Spec.NodeName) }},
}

// podStatus is the STATUS column, following kubectl's rules: the phase or reason, then init container
// progress ("Init:0/1", "Init:CrashLoopBackOff"), then the main containers' waiting or terminated reasons
// ("ContainerCreating", "CrashLoopBackOff", "Completed"), and "Terminating" for a pod being deleted.
func podStatus(pod *corev1.Pod) string {
	reason := string(pod.Status.Phase)
	if pod.Status.Reason != "" {
		reason = pod.Status.Reason
	}
	initializing := false
	for i, cs := range pod.Status.InitContainerStatuses {
		switch {
		case cs.State.Terminated != nil && cs.State.Terminated.ExitCode == 0:
			continue
		case cs.State.Terminated != nil:
			if cs.State.Terminated.Reason != "" {
				reason = "Init:" + cs.State.Terminated.Reason
			} else if cs.State.Terminated.Signal != 0 {
				reason = fmt.Sprintf("Init:Signal:%d", cs.State.Terminated.Signal)
			} else {
				reason = fmt.Sprintf("Init:ExitCode:%d", cs.State.Terminated.ExitCode)
			}
		case cs.State.Waiting != nil && cs.State.Waiting.Reason != "" && cs.State.Waiting.Reason != "PodInitializing":
			reason = "Init:" + cs.State.Waiting.Reason
		default:
			reason = fmt.Sprintf("Init:%d/%d", i, len(pod.Spec.InitContainers))
		}
		initializing = true
		break
	}
	if !initializing {
		hasRunning := false
		for i := len(pod.Status.ContainerStatuses) - 1; i >= 0; i-- {
			cs := pod.Status.ContainerStatuses[i]
			switch {
			case cs.State.Waiting != nil && cs.State.Waiting.Reason != "":
				reason = cs.State.Waiting.Reason
			case cs.State.Terminated != nil && cs.State.Terminated.Reason != "":
				reason = cs.State.Terminated.Reason
			case cs.State.Terminated != nil && cs.State.Terminated.Signal != 0:
				reason = fmt.Sprintf("Signal:%d", cs.State.Terminated.Signal)
			case cs.State.Terminated != nil:
				reason = fmt.Sprintf("ExitCode:%d", cs.State.Terminated.ExitCode)
			case cs.Ready && cs.State.Running != nil:
				hasRunning = true
			}
		}
		if reason == "Completed" && hasRunning {
			reason = string(corev1.PodRunning)
		}
	}
	if pod.DeletionTimestamp != nil {
		if pod.Status.Reason == "NodeLost" {
			return "Unknown"
		}
		return "Terminating"
	}
	return reason
}

// podFromTemplate wraps a pod template in a pod, so templates get the pod's defaults and validation.
func podFromTemplate(t *corev1.PodTemplateSpec) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: t.ObjectMeta, Spec: t.Spec}
}
